package ratelog_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/ratelog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLimiter(t *testing.T) {
	l := ratelog.New(time.Hour)
	if ok, n := l.Allow("a"); !ok || n != 0 {
		t.Fatalf("first event: (%v, %d), want (true, 0)", ok, n)
	}
	for i := 0; i < 5; i++ {
		if ok, _ := l.Allow("a"); ok {
			t.Fatal("a repeat within the interval was allowed")
		}
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another key was held back")
	}
	l2 := ratelog.New(time.Nanosecond)
	l2.Allow("a")
	l2.Allow("a")
	time.Sleep(time.Millisecond) // the interval itself, not synchronisation
	for {
		if ok, n := l2.Allow("a"); ok {
			if n > 1 {
				t.Fatalf("suppressed %d, want at most 1", n)
			}
			break
		}
	}
}

func TestLimiterBoundsKeys(t *testing.T) {
	l := ratelog.New(time.Hour)
	for i := 0; i < 20000; i++ {
		if ok, _ := l.Allow(fmt.Sprint(i)); !ok {
			t.Fatalf("new key %d held back", i)
		}
	}
}

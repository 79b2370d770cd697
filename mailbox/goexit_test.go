package mailbox_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox"
)

// A Handle that ends its goroutine (runtime.Goexit, as testing's FailNow
// does) does not stop the mailbox: the items behind it are handled, Drain
// returns and Close does not wait for ever.
func TestHandleGoexitDoesNotStopTheMailbox(t *testing.T) {
	var mu sync.Mutex
	var handled []int
	gate := make(chan struct{})
	m, err := mailbox.New(mailbox.Config[int]{Handle: func(i int) {
		if i == 0 {
			<-gate // the items behind it are queued before it ends
			runtime.Goexit()
		}
		mu.Lock()
		handled = append(handled, i)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i := range 4 {
		if err := m.Post(i); err != nil {
			t.Fatal(err)
		}
	}
	close(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Drain(ctx); err != nil {
		t.Fatalf("Drain after a Handle ended its goroutine: %v", err)
	}
	// And it goes on taking new items.
	if err := m.Post(4); err != nil {
		t.Fatal(err)
	}
	if err := m.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != 4 || handled[0] != 1 || handled[3] != 4 {
		t.Fatalf("handled %v, want [1 2 3 4]", handled)
	}
}

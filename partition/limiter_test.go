package partition_test

import (
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/partition"
)

func TestLimiterAIMD(t *testing.T) {
	tests := []struct {
		name  string
		cfg   partition.LimiterConfig
		steps string // s = success, c = capacity, t = transient
		want  int
	}{
		{"initial", partition.LimiterConfig{Initial: 10, Min: 1, Max: 100}, "", 10},
		{"additive increase", partition.LimiterConfig{Initial: 10, Min: 1, Max: 100}, "sss", 13},
		{"capped at max", partition.LimiterConfig{Initial: 99, Min: 1, Max: 100}, "ssss", 100},
		{"halved", partition.LimiterConfig{Initial: 10, Min: 1, Max: 100}, "c", 5},
		{"floor at min", partition.LimiterConfig{Initial: 10, Min: 2, Max: 100}, "cccccc", 2},
		{"transient unchanged", partition.LimiterConfig{Initial: 10, Min: 1, Max: 100}, "ttt", 10},
		{"recovers", partition.LimiterConfig{Initial: 10, Min: 1, Max: 100}, "cccc" + "sssss", 6},
		{"bad config clamped", partition.LimiterConfig{Initial: 0, Min: 0, Max: 0}, "c", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := partition.NewLimiter(tt.cfg)
			for _, c := range tt.steps {
				switch c {
				case 's':
					l.OnSuccess()
				case 'c':
					l.OnCapacity()
				case 't':
					l.OnTransient()
				}
			}
			if got := l.Limit(); got != tt.want {
				t.Fatalf("limit = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestLimiterAcquire(t *testing.T) {
	l := partition.NewLimiter(partition.LimiterConfig{Initial: 10, Min: 1, Max: 100})
	if g := l.TryAcquire(4); g != 4 {
		t.Fatalf("acquire 4 = %d", g)
	}
	if g := l.TryAcquire(100); g != 6 {
		t.Fatalf("acquire rest = %d, want 6", g)
	}
	if g := l.TryAcquire(1); g != 0 {
		t.Fatalf("acquire at limit = %d, want 0", g)
	}
	if g := l.TryAcquire(0); g != 0 {
		t.Fatalf("acquire 0 = %d", g)
	}
	l.Release(3)
	if l.InFlight() != 7 {
		t.Fatalf("in flight = %d", l.InFlight())
	}
	l.OnCapacity() // limit 5 < in flight 7: nothing more until releases
	if g := l.TryAcquire(1); g != 0 {
		t.Fatalf("acquire over lowered limit = %d", g)
	}
	l.Release(100)
	if l.InFlight() != 0 {
		t.Fatalf("over-release must clamp at 0, got %d", l.InFlight())
	}
}

func TestLimiterConcurrentNeverExceeds(t *testing.T) {
	l := partition.NewLimiter(partition.LimiterConfig{Initial: 8, Min: 1, Max: 8})
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := 0
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				if g := l.TryAcquire(3); g > 0 {
					mu.Lock()
					peak = max(peak, l.InFlight())
					mu.Unlock()
					l.Release(g)
				}
			}
		}()
	}
	wg.Wait()
	if peak > 8 || l.InFlight() != 0 {
		t.Fatalf("peak %d (limit 8), final in flight %d", peak, l.InFlight())
	}
}

func TestBackoffDelay(t *testing.T) {
	b := partition.BackoffConfig{Base: 100 * time.Millisecond, Cap: 30 * time.Second}
	tests := []struct {
		attempt int
		ceiling time.Duration
	}{
		{-1, 100 * time.Millisecond},
		{0, 100 * time.Millisecond},
		{1, 200 * time.Millisecond},
		{5, 3200 * time.Millisecond},
		{9, 30 * time.Second},
		{64, 30 * time.Second},
		{1 << 30, 30 * time.Second},
	}
	for _, tt := range tests {
		maxSeen := time.Duration(0)
		for range 300 {
			d := b.Delay(tt.attempt)
			if d < 0 || d >= tt.ceiling {
				t.Fatalf("attempt %d: delay %v outside [0, %v)", tt.attempt, d, tt.ceiling)
			}
			maxSeen = max(maxSeen, d)
		}
		if maxSeen < tt.ceiling/4 {
			t.Fatalf("attempt %d: max of 300 draws %v; jitter not spread up to %v", tt.attempt, maxSeen, tt.ceiling)
		}
	}
	if d := (partition.BackoffConfig{}).Delay(3); d != 0 {
		t.Fatalf("zero config delay = %v", d)
	}
}

package mailbox_test

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
)

// Under DropOldest, OnEvict sees each evicted item, in order, on the
// posting goroutine before OnDrop does, and nothing else.
func TestOnEvictSeesEachEvictedItemBeforeOnDrop(t *testing.T) {
	started, free := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var calls []string
	note := func(s string) {
		mu.Lock()
		calls = append(calls, s)
		mu.Unlock()
	}
	m, err := mailbox.New(mailbox.Config[int]{
		Capacity: 2,
		Overflow: mailbox.DropOldest,
		Handle: func(i int) {
			if i == 1 {
				close(started)
				<-free
			}
			note("handle " + strconv.Itoa(i))
		},
		OnEvict: func(i int) { note("evict " + strconv.Itoa(i)) },
		OnDrop: func(i int, r mailbox.DropReason) {
			note(r.String() + " " + strconv.Itoa(i))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	unfree := sync.OnceFunc(func() { close(free) })
	t.Cleanup(unfree) // first: a failing check must not leave Close waiting on Handle(1)
	for i := 1; i <= 5; i++ {
		if err := m.Post(i); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			<-started
		}
	}
	unfree()
	got := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
	testutil.WaitFor(t, 10*time.Second, "all handled", func() bool { return len(got()) == 7 })
	want := []string{"evict 2", "dropped-oldest 2", "evict 3", "dropped-oldest 3", "handle 1", "handle 4", "handle 5"}
	if g := got(); !slices.Equal(g, want) {
		t.Fatalf("calls %q, want %q", g, want)
	}
}

// While several posters keep a DropOldest mailbox full, its consumer keeps
// handling items: a flood is what DropOldest is for, and the newest items
// are the ones it keeps so that they run. Each eviction's OnDrop takes
// about 2 µs. A mailbox that held the items behind an evicted one until
// no eviction's OnDrop ran would starve its consumer here: four posters'
// OnDrops overlap nearly all the time (it handled none in a second while
// 800,000 were dropped). The ratio checked, one handled for every
// thousand dropped, is ten times below what the consumer does (one for
// every fifty to a hundred).
func TestConsumerKeepsHandlingWhileConcurrentPostersEvict(t *testing.T) {
	const posters, onDropWork, period = 4, 2 * time.Microsecond, time.Second
	var handled, dropped atomic.Int64
	m, err := mailbox.New(mailbox.Config[int]{
		Capacity: 16,
		Overflow: mailbox.DropOldest,
		Handle:   func(int) { handled.Add(1) },
		OnDrop: func(_ int, r mailbox.DropReason) {
			if r == mailbox.DroppedOldest {
				dropped.Add(1)
				// About what answering a dropped reliable message costs
				// (a stream lookup, a receipt): a few microseconds.
				for t0 := time.Now(); time.Since(t0) < onDropWork; {
				}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range posters {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_ = m.Post(i)
			}
		})
	}
	timer := time.NewTimer(period)
	<-timer.C
	h := handled.Load()
	close(stop)
	wg.Wait()
	d := dropped.Load()
	t.Logf("%d posters, %v: handled %d, dropped oldest %d", posters, period, h, d)
	if h*1000 < d {
		t.Fatalf("consumer starved: handled %d items in %v while %d were dropped oldest", h, period, d)
	}
}

package mailbox_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
)

// Under DropOldest, an item queued behind an evicted one is not handed to
// Handle, nor taken by TakeIf, while the evicted item's OnDrop runs: what
// OnDrop decides about an item (a reliable message's refusal, which may
// refuse the messages chained behind it too) comes before its successors
// run. Items 2 and 3 wait behind a busy Handle(1); 4 evicts 2, whose
// OnDrop is held; Handle(1) then returns (or, in the take case, asks
// TakeIf for the next item) and must get 3 only once OnDrop(2) returned.
func TestItemsBehindAnEvictedOneWaitForItsDrop(t *testing.T) {
	for _, take := range []bool{false, true} {
		t.Run(map[bool]string{false: "handle", true: "take"}[take], func(t *testing.T) { itemsWaitForTheDrop(t, take) })
	}
}

func itemsWaitForTheDrop(t *testing.T, take bool) {
	started, free := make(chan struct{}), make(chan struct{})
	inDrop, releaseDrop := make(chan int, 1), make(chan struct{})
	var mu sync.Mutex
	var handled []int
	var m *mailbox.Mailbox[int]
	m, err := mailbox.New(mailbox.Config[int]{
		Capacity: 2,
		Overflow: mailbox.DropOldest,
		Handle: func(i int) {
			if i == 1 {
				close(started)
				<-free
			}
			mu.Lock()
			handled = append(handled, i)
			mu.Unlock()
			if i == 1 && take {
				if j, ok := m.TakeIf(func(int) bool { return true }); ok {
					mu.Lock()
					handled = append(handled, j)
					mu.Unlock()
				}
			}
		},
		OnDrop: func(i int, r mailbox.DropReason) {
			if r == mailbox.DroppedOldest {
				inDrop <- i
				<-releaseDrop
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	// Run first: a failing check must not leave Close waiting on a held
	// Handle or OnDrop.
	unfree, release := closer(free), closer(releaseDrop)
	t.Cleanup(func() { unfree(); release() })
	got := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(handled)
	}
	for _, i := range []int{1, 2, 3} {
		if err := m.Post(i); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			<-started
		}
	}
	posted := make(chan error, 1)
	go func() { posted <- m.Post(4) }() // evicts 2; returns once OnDrop(2) does
	if i := <-inDrop; i != 2 {
		t.Fatalf("evicted %d, want 2", i)
	}
	unfree()
	testutil.WaitFor(t, 10*time.Second, "Handle(1) went on", func() bool { return len(got()) >= 1 })
	// A negative check: without the wait, 3 follows in microseconds.
	if testutil.Poll(200*time.Millisecond, func() bool { return len(got()) > 1 }) {
		t.Fatalf("handled %v while the evicted item's OnDrop was still running", got())
	}
	release()
	if err := <-posted; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "3 and 4 handled", func() bool { return len(got()) == 3 })
	if h := got(); !slices.Equal(h, []int{1, 3, 4}) {
		t.Fatalf("handled %v, want [1 3 4]", h)
	}
}

// closer returns a function that closes ch the first time it is called.
func closer(ch chan struct{}) func() {
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

package mailbox_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
)

// TestTakeIf: a handler takes the items queued behind its own while take
// accepts them, in FIFO order, stops at the first it refuses (which is
// handled next, in order) and never sees an item twice.
func TestTakeIf(t *testing.T) {
	var (
		mu      sync.Mutex
		batches [][]int
		mb      *mailbox.Mailbox[int]
	)
	gate := make(chan struct{})
	mb, err := mailbox.New(mailbox.Config[int]{
		Handle: func(first int) {
			if first == 0 {
				<-gate // let the test queue items behind it
			}
			batch := []int{first}
			for {
				// Odd items end a batch: they are handled alone.
				item, ok := mb.TakeIf(func(i int) bool { return i%2 == 0 && first%2 == 0 })
				if !ok {
					break
				}
				batch = append(batch, item)
			}
			mu.Lock()
			batches = append(batches, batch)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mb.Close)
	for _, i := range []int{0, 2, 4, 5, 6, 8} {
		if err := mb.Post(i); err != nil {
			t.Fatal(err)
		}
	}
	close(gate)
	testutil.WaitFor(t, waitTimeout, "all handled", func() bool { return mb.Stats().Processed == 6 })
	mu.Lock()
	defer mu.Unlock()
	if got := fmt.Sprint(batches); got != "[[0 2 4] [5] [6 8]]" {
		t.Fatalf("batches %s, want [[0 2 4] [5] [6 8]]", got)
	}
	if _, ok := mb.TakeIf(func(int) bool { return true }); ok {
		t.Fatal("TakeIf on an empty mailbox returned an item")
	}
}

// TestRetryAfterCountsTakenItems: a Handle that takes the items behind its
// own handled all of them in its time, so the hint's time per item is its
// duration divided by the items, not its whole duration (which made a
// batching actor look a hundred times slower than it is and kept its
// senders waiting seconds for room it had in milliseconds).
func TestRetryAfterCountsTakenItems(t *testing.T) {
	const items = 100
	var (
		mb     *mailbox.Mailbox[int]
		handle time.Duration // the batch's own measure of its duration
	)
	gate := make(chan struct{})
	mb, err := mailbox.New(mailbox.Config[int]{
		Handle: func(int) {
			start := time.Now()
			<-gate
			for {
				if _, ok := mb.TakeIf(func(int) bool { return true }); !ok {
					break
				}
			}
			time.Sleep(2 * time.Millisecond) // the batch's work
			handle = time.Since(start)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mb.Close)
	for i := range items {
		if err := mb.Post(i); err != nil {
			t.Fatal(err)
		}
	}
	close(gate)
	testutil.WaitFor(t, waitTimeout, "all handled", func() bool { return mb.Stats().Processed == items && !mb.Stats().Running })
	per := mb.Stats().HandleTimeEWMA
	if per <= 0 || per*items/5 > handle {
		t.Fatalf("handle time per item %v after %d items handled in %v, want about %v", per, items, handle, handle/items)
	}
}

package mailbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
)

// TestMailboxBoundedByBytes: with MaxBytes, a mailbox of few large items
// is full by bytes long before it is full by count, under every overflow
// strategy; an item larger than MaxBytes still gets through an empty one.
// Items cost their own value in bytes; item 0 holds the handler.
func TestMailboxBoundedByBytes(t *testing.T) {
	tests := []struct {
		o           mailbox.Overflow
		posts       []int
		wantErr     []bool
		wantHandled []int
		wantDropped []int
	}{
		// 400+400 fit 1000; 300 does not: refused.
		{mailbox.Reject, []int{400, 400, 300, 100}, []bool{false, false, true, false}, []int{0, 400, 400, 100}, nil},
		// 300 is dropped (and Post errs), 100 still fits.
		{mailbox.DropNewest, []int{400, 400, 300, 100}, []bool{false, false, true, false}, []int{0, 400, 400, 100}, []int{300}},
		// 900 evicts both 400s; then 100 fits beside 900.
		{mailbox.DropOldest, []int{400, 400, 900, 100}, []bool{false, false, false, false}, []int{0, 900, 100}, []int{400, 400}},
	}
	for _, tt := range tests {
		t.Run(tt.o.String(), func(t *testing.T) {
			g := newGatedSizedBox(t, 1000, tt.o)
			for i, p := range tt.posts {
				err := g.m.Post(p)
				if (err != nil) != tt.wantErr[i] {
					t.Fatalf("Post(%d) = %v, want error %v", p, err, tt.wantErr[i])
				}
				if err != nil && !errors.Is(err, mailbox.ErrMailboxFull) {
					t.Fatalf("Post(%d) = %v, want ErrMailboxFull", p, err)
				}
				if st := g.m.Stats(); st.Bytes > st.MaxBytes {
					t.Fatalf("after Post(%d): %d bytes queued, bound %d", p, st.Bytes, st.MaxBytes)
				}
			}
			g.release()
			testutil.WaitFor(t, waitTimeout, "handled", func() bool { return len(g.handledItems()) == len(tt.wantHandled) })
			if got := g.handledItems(); !equalInts(got, tt.wantHandled) {
				t.Fatalf("handled %v, want %v", got, tt.wantHandled)
			}
			if got, _ := g.drops.snapshot(); !equalInts(got, tt.wantDropped) {
				t.Fatalf("dropped %v, want %v", got, tt.wantDropped)
			}
			if st := g.m.Stats(); st.Bytes != 0 {
				t.Fatalf("%d bytes counted in a drained mailbox", st.Bytes)
			}
		})
	}
}

func TestMailboxOversizeItemFitsWhenEmpty(t *testing.T) {
	g := newGatedSizedBox(t, 1000, mailbox.Reject)
	if err := g.m.Post(5000); err != nil {
		t.Fatalf("an item larger than MaxBytes into an empty mailbox: %v", err)
	}
	if err := g.m.Post(1); !errors.Is(err, mailbox.ErrMailboxFull) {
		t.Fatalf("Post behind an oversize item = %v, want full", err)
	}
	g.release()
	testutil.WaitFor(t, waitTimeout, "handled", func() bool { return len(g.handledItems()) == 2 })
}

// newGatedSizedBox is newGatedBox with MaxBytes, items costing their value.
func newGatedSizedBox(tb testing.TB, maxBytes int64, o mailbox.Overflow) *gatedBox {
	tb.Helper()
	g := &gatedBox{drops: &dropLog{}, started: make(chan struct{}), gate: make(chan struct{})}
	m, err := mailbox.New(mailbox.Config[int]{
		Capacity: 100,
		MaxBytes: maxBytes,
		Size:     func(i int) int64 { return int64(i) },
		Overflow: o,
		Handle: func(i int) {
			if i == 0 {
				close(g.started)
				<-g.gate
			}
			g.mu.Lock()
			g.handled = append(g.handled, i)
			g.mu.Unlock()
		},
		OnDrop: g.drops.add,
	})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	g.m = m
	tb.Cleanup(func() { g.release(); m.Close() })
	if err := m.Post(0); err != nil {
		tb.Fatalf("Post(0): %v", err)
	}
	select {
	case <-g.started:
	case <-time.After(waitTimeout):
		tb.Fatal("handler did not start")
	}
	return g
}

// Room says exactly how many more items of a size Post takes: that many
// go in, the next is refused, by places or by bytes, from any fill.
func TestMailboxRoomIsWhatPostTakes(t *testing.T) {
	for _, maxBytes := range []int64{0, 1000} {
		for _, before := range [][]int{nil, {300}, {450, 450}, {999}} {
			for _, size := range []int{1, 7, 100, 333, 999, 1500} {
				g := newGatedSizedBox(t, maxBytes, mailbox.Reject)
				for _, b := range before {
					if err := g.m.Post(b); err != nil {
						t.Fatal(err)
					}
				}
				k := g.m.Room(int64(size))
				for i := range k {
					if err := g.m.Post(size); err != nil {
						t.Fatalf("max %d bytes after %v: Room(%d) = %d, but post %d was refused: %v", maxBytes, before, size, k, i+1, err)
					}
				}
				if err := g.m.Post(size); !errors.Is(err, mailbox.ErrMailboxFull) {
					t.Fatalf("max %d bytes after %v: Room(%d) = %d, but one more went in (%v)", maxBytes, before, size, k, err)
				}
				if r := g.m.Room(int64(size)); r != 0 {
					t.Fatalf("max %d bytes after %v: Room(%d) = %d once full", maxBytes, before, size, r)
				}
				g.release()
			}
		}
	}
}

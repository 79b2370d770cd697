package mailbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
)

// PostLow's items take at most half of the capacity, under every overflow
// strategy, however many items Post has queued; Post still fills the rest.
// Under DropNewest a refused low item is dropped, under DropOldest nothing
// queued is.
func TestPostLowKeepsHalfTheMailbox(t *testing.T) {
	for _, o := range []mailbox.Overflow{mailbox.Reject, mailbox.DropNewest, mailbox.DropOldest} {
		t.Run(o.String(), func(t *testing.T) {
			g := newGatedBox(t, 4, o)
			if err := g.m.Post(1); err != nil {
				t.Fatal(err)
			}
			for i := 2; i <= 3; i++ {
				if err := g.m.PostLow(i, 0); err != nil {
					t.Fatalf("PostLow(%d) within the low half: %v", i, err)
				}
			}
			err := g.m.PostLow(4, 0)
			var ce *mailbox.CapacityError
			if !errors.As(err, &ce) || !errors.Is(err, mailbox.ErrMailboxFull) || ce.RetryAfter <= 0 {
				t.Fatalf("PostLow(4) over the low half = %v, want a *CapacityError with a positive RetryAfter", err)
			}
			if err := g.m.Post(5); err != nil {
				t.Fatalf("Post(5) into the kept half: %v", err)
			}
			// Full now (1, 2, 3, 5): a low item evicts nothing, even under
			// DropOldest.
			if err := g.m.PostLow(6, 0); err == nil {
				t.Fatal("PostLow(6) into a full mailbox succeeded")
			}
			g.release()
			if err := g.m.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got, want := g.handledItems(), []int{0, 1, 2, 3, 5}; !equalInts(got, want) {
				t.Fatalf("handled %v, want %v", got, want)
			}
			dropped, _ := g.drops.snapshot()
			s := g.m.Stats()
			switch o {
			case mailbox.DropNewest:
				if !equalInts(dropped, []int{4, 6}) || s.DroppedNewest != 2 {
					t.Fatalf("dropped %v (DroppedNewest %d), want [4 6]", dropped, s.DroppedNewest)
				}
			default:
				if len(dropped) != 0 || s.Rejected != 2 {
					t.Fatalf("dropped %v, Rejected %d; want nothing dropped, 2 rejected", dropped, s.Rejected)
				}
			}
		})
	}
}

// Low items leave the count as they are handled, so the low half opens
// again; a mailbox of capacity 1 takes one low item.
func TestPostLowShareFreesAsItemsLeave(t *testing.T) {
	g := newGatedBox(t, 2, mailbox.Reject)
	if err := g.m.PostLow(1, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.m.PostLow(2, 0); !errors.Is(err, mailbox.ErrMailboxFull) {
		t.Fatalf("second low item in a mailbox of 2 = %v, want ErrMailboxFull", err)
	}
	g.release()
	testutil.WaitFor(t, waitTimeout, "handled", func() bool { return len(g.handledItems()) == 2 })
	if err := g.m.PostLow(3, 0); err != nil {
		t.Fatalf("a low item after the last one left: %v", err)
	}

	one := newGatedBox(t, 1, mailbox.Reject)
	if err := one.m.PostLow(1, 0); err != nil {
		t.Fatalf("PostLow into an empty mailbox of capacity 1 = %v", err)
	}
	if err := one.m.PostLow(2, 0); !errors.Is(err, mailbox.ErrMailboxFull) {
		t.Fatalf("PostLow into a full mailbox of capacity 1 = %v, want ErrMailboxFull", err)
	}
}

// Under MaxBytes low items take at most half of the bytes, and leave
// keepBytes for an item expected back; keepBytes over MaxBytes keeps all.
func TestPostLowBytes(t *testing.T) {
	g := newGatedSizedBox(t, 1000, mailbox.Reject)
	if err := g.m.PostLow(400, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.m.PostLow(200, 0); !errors.Is(err, mailbox.ErrMailboxFull) {
		t.Fatalf("PostLow(200) over half the bytes = %v, want ErrMailboxFull", err)
	}
	if err := g.m.Post(500); err != nil {
		t.Fatalf("Post(500) within the bytes: %v", err)
	}
	if err := g.m.PostLow(50, 600); !errors.Is(err, mailbox.ErrMailboxFull) {
		t.Fatalf("PostLow(50) keeping 600 of 1000 with 400 low = %v, want ErrMailboxFull", err)
	}
	g.release()
	testutil.WaitFor(t, waitTimeout, "handled", func() bool { return len(g.handledItems()) == 3 })
	if err := g.m.PostLow(50, 2000); !errors.Is(err, mailbox.ErrMailboxFull) {
		t.Fatalf("PostLow into an empty mailbox keeping more than MaxBytes = %v, want ErrMailboxFull", err)
	}
	if err := g.m.PostLow(50, 900); err != nil {
		t.Fatalf("PostLow(50) keeping 900 of 1000 = %v", err)
	}
	testutil.WaitFor(t, waitTimeout, "the low item handled", func() bool { return len(g.handledItems()) == 4 })
	if got := g.handledItems(); got[3] != 50 {
		t.Fatalf("handled %v, want the low item 50 last", got)
	}
}

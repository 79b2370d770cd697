package mailbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
)

// PostLow finds a mailbox full at half its capacity under every overflow
// strategy; Post still fills the other half. Under DropNewest the refused
// item is dropped, under DropOldest nothing queued is.
func TestPostLowKeepsHalfTheMailbox(t *testing.T) {
	for _, o := range []mailbox.Overflow{mailbox.Reject, mailbox.DropNewest, mailbox.DropOldest} {
		t.Run(o.String(), func(t *testing.T) {
			g := newGatedBox(t, 4, o)
			for i := 1; i <= 2; i++ {
				if err := g.m.PostLow(i); err != nil {
					t.Fatalf("PostLow(%d) into a mailbox below half: %v", i, err)
				}
			}
			err := g.m.PostLow(3)
			var ce *mailbox.CapacityError
			if !errors.As(err, &ce) || !errors.Is(err, mailbox.ErrMailboxFull) || ce.RetryAfter <= 0 {
				t.Fatalf("PostLow(3) at half = %v, want a *CapacityError with a positive RetryAfter", err)
			}
			for i := 4; i <= 5; i++ {
				if err := g.m.Post(i); err != nil {
					t.Fatalf("Post(%d) into the kept half: %v", i, err)
				}
			}
			if err := g.m.PostLow(6); err == nil {
				t.Fatal("PostLow(6) into a full mailbox succeeded")
			}
			g.release()
			if err := g.m.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got, want := g.handledItems(), []int{0, 1, 2, 4, 5}; !equalInts(got, want) {
				t.Fatalf("handled %v, want %v", got, want)
			}
			dropped, _ := g.drops.snapshot()
			s := g.m.Stats()
			switch o {
			case mailbox.DropNewest:
				if !equalInts(dropped, []int{3, 6}) || s.DroppedNewest != 2 {
					t.Fatalf("dropped %v (DroppedNewest %d), want [3 6]", dropped, s.DroppedNewest)
				}
			default:
				if len(dropped) != 0 || s.Rejected != 2 {
					t.Fatalf("dropped %v, Rejected %d; want nothing dropped, 2 rejected", dropped, s.Rejected)
				}
			}
		})
	}
}

// PostLow halves the byte bound too, and a mailbox of capacity 1 takes
// no low item at all.
func TestPostLowBytesAndCapacityOne(t *testing.T) {
	g := newGatedSizedBox(t, 1000, mailbox.Reject)
	if err := g.m.PostLow(400); err != nil {
		t.Fatal(err)
	}
	if err := g.m.PostLow(200); !errors.Is(err, mailbox.ErrMailboxFull) {
		t.Fatalf("PostLow(200) over half the bytes = %v, want ErrMailboxFull", err)
	}
	if err := g.m.Post(500); err != nil {
		t.Fatalf("Post(500) within the bytes: %v", err)
	}
	g.release()
	testutil.WaitFor(t, waitTimeout, "handled", func() bool { return len(g.handledItems()) == 3 })

	one := newGatedBox(t, 1, mailbox.Reject)
	if err := one.m.PostLow(1); !errors.Is(err, mailbox.ErrMailboxFull) {
		t.Fatalf("PostLow into an empty mailbox of capacity 1 = %v, want ErrMailboxFull", err)
	}
	if err := one.m.Post(2); err != nil {
		t.Fatal(err)
	}
}

package outbox_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/storecheck"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// A commit bbolt wrote up to its meta page and then failed (the meta
// page's fsync failing) is what readers of the file see from then on,
// while its callers were told it failed, and the disk has just shown it
// may not keep what it was given. The store stops: that commit's callers
// and every later write and Head get ErrFailed, even once the disk takes
// writes again (a later fsync succeeding says nothing of the pages the
// failed one lost). Its memory follows the file meanwhile, and a reopen
// reads what the file holds.
func TestCommitWrittenButNotSyncedStopsTheStore(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "m1")
	m2, m3 := e.msg(t, "a@n1", "m2"), e.msg(t, "a@n1", "m3")
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(e.path, syncErr, func(meta bool) bool { return meta && failing.Load() })()
	e.reopen(t, nil)
	failing.Store(true)

	_, err := e.Enqueue(context.Background(), m2)
	if !errors.Is(err, outbox.ErrFailed) || !errors.Is(err, syncErr) {
		t.Fatalf("Enqueue whose commit was written but not synced: %v, want ErrFailed wrapping the disk's error", err)
	}
	failing.Store(false)
	if _, err := e.Enqueue(context.Background(), m3); !errors.Is(err, outbox.ErrFailed) {
		t.Fatalf("Enqueue after the failure: %v, want ErrFailed", err)
	}
	if err := e.Ack("a@n1", []uint64{m2.GetEnvelope().GetSequence()}); !errors.Is(err, outbox.ErrFailed) {
		t.Fatalf("Ack after the failure: %v, want ErrFailed", err)
	}
	if _, _, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 10}); !errors.Is(err, outbox.ErrFailed) {
		t.Fatalf("Head after the failure: %v, want ErrFailed", err)
	}
	if err := e.Err(); !errors.Is(err, outbox.ErrFailed) || !errors.Is(err, syncErr) {
		t.Fatalf("Err() = %v, want ErrFailed wrapping the disk's error", err)
	}
	if st := e.Stats(); st.Depth != 2 || st.CommitFailures != 1 {
		t.Fatalf("Stats after the failure: depth %d, %d commit failures; want 2 (the file's m1 and m2) and 1", st.Depth, st.CommitFailures)
	}

	if err := e.Close(); err != nil {
		t.Fatalf("Close of the failed store: %v", err)
	}
	if _, err := os.Stat(storecheck.CleanPath(e.path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close of the failed store marked it clean (%v): the next Open would not check the whole file", err)
	}
	e.Store = mustOpen(t, config(e.path, e.clk, e.mut))
	if err := e.Err(); err != nil {
		t.Fatalf("Err() after reopening: %v", err)
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("queue after reopening = %v, want what the file holds: [m1 m2]", got)
	}
	e.send(t, "a@n1", "m4")
}

// An Ack whose commit was written but not synced: the store stops with
// its memory agreeing with the file (the acked message is gone from both),
// so nothing it hands out disagrees with what a reopen reads.
func TestAckWrittenButNotSyncedAgreesWithTheFile(t *testing.T) {
	e := open(t, nil)
	seqs := e.send(t, "a@n1", "m1", "m2")
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(e.path, syncErr, func(meta bool) bool { return meta && failing.Load() })()
	e.reopen(t, nil)
	failing.Store(true)
	if err := e.Ack("a@n1", seqs[:1]); !errors.Is(err, outbox.ErrFailed) {
		t.Fatalf("Ack whose commit was written but not synced: %v, want ErrFailed", err)
	}
	if st := e.Stats(); st.Depth != 1 || st.Delivered != 1 {
		t.Fatalf("Stats after the failure: depth %d, %d delivered; want 1 and 1 (as the file has it)", st.Depth, st.Delivered)
	}
	failing.Store(false)
	e.reopen(t, nil)
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"m2"}) {
		t.Fatalf("queue after reopening = %v, want [m2]", got)
	}
}

// A commit that failed before bbolt wrote its meta page is not in the
// file: its callers get the disk's error, nothing changed, and the store
// works again once the disk does (a full disk is this case).
func TestCommitFailingBeforeItsMetaPageLeavesTheStoreUsable(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "m1")
	m2 := e.msg(t, "a@n1", "m2")
	full := errors.New("write outbox.db: no space left on device")
	var failing atomic.Bool
	defer faults.FailWrites(e.path, full, func(meta bool) bool { return !meta && failing.Load() })()
	e.reopen(t, nil)
	failing.Store(true)
	if _, err := e.Enqueue(context.Background(), m2); !errors.Is(err, full) || errors.Is(err, outbox.ErrFailed) {
		t.Fatalf("Enqueue whose pages could not be written: %v, want the disk's error and not ErrFailed", err)
	}
	if err := e.Err(); err != nil {
		t.Fatalf("Err() after a commit that never reached the file: %v", err)
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"m1"}) {
		t.Fatalf("queue after the failed commit = %v, want [m1]", got)
	}
	failing.Store(false)
	e.put(t, m2)
	e.reopen(t, nil)
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("queue after reopening = %v, want [m1 m2]", got)
	}
}

// Writes handed to the committer before the store stopped, and committed
// after it, fail with ErrFailed too: none is written behind the failure.
func TestWritesQueuedBehindTheFailedCommitAreRefused(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.MaxBatch = 1 })
	m1, m2 := e.msg(t, "a@n1", "m1"), e.msg(t, "a@n1", "m2")
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(e.path, syncErr, func(meta bool) bool { return meta && failing.Load() })()
	e.reopen(t, nil)

	release := outbox.Stall(t, e.Store)
	failing.Store(true)
	errs := make([]chan error, 2)
	for i, m := range []*pb.StoredMessage{m1, m2} {
		errs[i] = make(chan error, 1)
		go func() {
			_, err := e.Enqueue(context.Background(), m)
			errs[i] <- err
		}()
		testutil.WaitFor(t, 10*time.Second, "the enqueue to wait for the stalled committer", func() bool {
			return outbox.QueuedOps(e.Store) == i+1
		})
	}
	release()
	if err := <-errs[0]; !errors.Is(err, outbox.ErrFailed) || !errors.Is(err, syncErr) {
		t.Fatalf("Enqueue whose commit was written but not synced: %v, want ErrFailed wrapping the disk's error", err)
	}
	if err := <-errs[1]; !errors.Is(err, outbox.ErrFailed) {
		t.Fatalf("Enqueue queued behind the failed commit: %v, want ErrFailed", err)
	}
	failing.Store(false)
	e.reopen(t, nil)
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"m1"}) {
		t.Fatalf("queue after reopening = %v, want [m1]: nothing written behind the failure", got)
	}
}

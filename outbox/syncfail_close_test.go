package outbox_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/storecheck"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// The store stopped because a commit's sync failed (here perhaps the
// reservation of a sequence block): what the disk holds is unknown. Close
// must not then mark the shutdown clean, which would make the next Open
// skip the deep (key order) check of the file.
func TestCloseAfterASyncFailureIsNotClean(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "m1")
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(e.path, syncErr, func(meta bool) bool { return meta && failing.Load() })()
	e.reopen(t, nil)
	failing.Store(true)
	if seq, err := e.ReserveSequence(); err == nil { // may be the failing commit itself (a new block)
		_, _ = e.Enqueue(context.Background(), &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: "m2", Sequence: seq}})
	}
	if err := e.Err(); !errors.Is(err, outbox.ErrFailed) {
		t.Fatalf("Err() = %v, want ErrFailed", err)
	}
	failing.Store(false)
	if err := e.Close(); err != nil {
		t.Logf("Close of the failed store: %v", err)
	}
	_, err := os.Stat(storecheck.CleanPath(e.path))
	e.Store = mustOpen(t, config(e.path, e.clk, e.mut)) // for cleanup
	if err == nil {
		t.Fatalf("Close of a store whose commit failed to sync wrote the clean-shutdown marker %s: the next Open skips the deep check of a file the disk may not have kept", storecheck.CleanPath(e.path))
	}
}

// A commit that failed after bbolt wrote its meta page has its effects
// applied to memory, the receiver streams its housekeeping forgot too:
// they are counted (Stats.StreamsForgotten) and passed to OnForget, so
// what keeps its own record of them (the daemon's inbox) forgets them as
// well; no later commit could find them again, they are gone from the file.
func TestFailedCommitTellsOfTheStreamsItForgot(t *testing.T) {
	var mu sync.Mutex
	var told int
	mut := func(c *outbox.Config) {
		c.StreamRetention = 10 * time.Hour
		c.RetentionMargin = time.Hour
		c.OnForget = func(streams []outbox.ForgottenStream) {
			mu.Lock()
			told += len(streams)
			mu.Unlock()
		}
	}
	e := open(t, mut)
	sk := outbox.StreamKey("n2", [16]byte{}, 1, "old")
	if err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: sk, Watermark: 7}); err != nil {
		t.Fatal(err)
	}
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(e.path, syncErr, func(meta bool) bool { return meta && failing.Load() })()
	e.reopen(t, nil)
	e.clk.Advance(10*time.Hour + time.Second)
	failing.Store(true)
	err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: outbox.StreamKey("n2", [16]byte{}, 1, "other"), Watermark: 1})
	if !errors.Is(err, outbox.ErrFailed) {
		t.Fatalf("commit: %v, want ErrFailed", err)
	}
	w, forgotten, err := e.Watermark(sk)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	n := told
	mu.Unlock()
	t.Logf("file: watermark %d, forgotten horizon %d; Stats.StreamsForgotten %d; OnForget told of %d", w, forgotten, e.Stats().StreamsForgotten, n)
	if w != 0 || forgotten != 7 {
		t.Fatalf("the failed commit did not forget the stream in the file (w %d, horizon %d): test setup", w, forgotten)
	}
	if got := e.Stats().StreamsForgotten; got != 1 || n != 1 {
		t.Fatalf("the file forgot 1 stream in the failed commit; Stats.StreamsForgotten = %d, OnForget told of %d: want 1 and 1", got, n)
	}
}

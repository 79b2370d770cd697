package node

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/outbox"
)

// A stream's commit is refused (a retry is scheduled). The disk recovers:
// commit C of the same watermark goes through, but a waiter that checked
// durable just before C ended (a copy's DUPLICATE, or the retry timer
// itself) joined C's pend, so C's callback takes the "more" branch and
// does not forget the retry; the follow-up commit D (same watermark) meets
// the disk full again and keeps the old retry. When the retry fires, the
// watermark is already durable: afterDurable answers at once and no
// commit runs, so the retry must forget itself there; else the entry (and
// the *inStream it holds, even after the stream is evicted) would stay in
// in.retries for good, and every later commit of every stream take in.mu.
func TestRetryOfADurableStreamIsForgotten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	s, err := outbox.Open(outbox.DefaultConfig(path))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := newInbound(s)
	defer in.settle()
	st, err := in.acquire(StreamID{Node: "p", Outbox: [16]byte{'p'}, Actor: "a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	diskFull := errors.New("write outbox.db: no space left on device")
	restore, _ := faults.FailCommits(path, diskFull)
	errs := make(chan error, 4)
	in.advance(st, 1, 0, nil, func(err error, _ uint64) { errs <- err }) // commit A: refused, retry due in 100 ms
	if err := <-errs; err == nil {
		t.Fatal("commit A went through a full disk")
	}
	restore()
	var restore2 func()
	in.afterDurable(st, 1, func(err error, _ uint64) { // commit C: goes through
		errs <- err
		// A waiter that read durable (0) just before C's success joins
		// C's pend; and the disk is full again for the follow-up D.
		in.wait(st, 1, 0, nil, false, func(err error, _ uint64) { errs <- err })
		restore2, _ = faults.FailCommits(path, diskFull)
	})
	if err := <-errs; err != nil {
		t.Fatalf("commit C: %v", err)
	}
	if err := <-errs; err == nil {
		t.Fatal("commit D went through a full disk")
	}
	restore2()
	if st.durable.Load() != st.w.Load() {
		t.Fatalf("durable %d, w %d", st.durable.Load(), st.w.Load())
	}
	in.release(st)
	testutil.WaitFor(t, 5*time.Second, "the retry of a stream whose watermark is durable to be forgotten", func() bool {
		in.mu.Lock()
		defer in.mu.Unlock()
		return len(in.retries) == 0 && !in.anyRetry.Load()
	})
}

package partition

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// The relay is the store's Sequencer from New on, so a Replay before Start
// (a boot that replays the dead letters, then starts) waits in Reserve for
// what SendAsync is storing below its sequence; the goroutine that takes
// SendAsync's commits off the storing lists (complete) runs from New too.
// When it ran only from Start, that Replay waited for a message committed
// long before, until Start or Close.
func TestReplayBeforeStartDoesNotWaitForCommittedAsyncSends(t *testing.T) {
	d := &versionsPeer{entered: make(chan struct{}), refused: map[string]bool{}, ran: map[string][]string{}}
	r := newTestRelay(t, d) // not started
	ctx := context.Background()
	dead := message("a@n1", "dead", 0)
	seq, err := r.store.ReserveSequence()
	if err != nil {
		t.Fatal(err)
	}
	dead.Envelope.Sequence = seq
	if err := r.store.DeadLetter(ctx, dead, "rejected: test"); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	if err := r.SendAsync(ctx, message("a@n1", "async", 0), func(_ Sent, err error) { committed <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-committed:
		if err != nil {
			t.Fatalf("SendAsync: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SendAsync never committed")
	}
	replayed := make(chan error, 1)
	go func() {
		_, err := r.store.Replay(outbox.DLQFilter{Recipient: "a@n1"})
		replayed <- err
	}()
	select {
	case err := <-replayed:
		if err != nil {
			t.Fatalf("Replay: %v", err)
		}
	case <-time.After(5 * time.Second):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("Replay before Start did not return in 5s: Reserve waits for a SendAsync message that committed already (its storing entry is cleared only by the completer, which Start runs)\n%s", buf)
	}
}

var _ = pb.Envelope_OVERWRITE

package outbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// A commit the disk refuses fails its callers with the disk's error, is
// counted in Stats.CommitFailures (the operator's signal of a full or
// failing disk), and changes nothing: the queue is as it was, and the
// store works again once the disk does.
func TestFailedCommitsAreCountedAndChangeNothing(t *testing.T) {
	e := open(t, nil)
	seqs := e.send(t, "a@n1", "kept")
	diskFull := errors.New("write outbox.db: no space left on device")
	restore, _ := faults.FailCommits(e.path, diskFull)

	if _, err := e.Enqueue(context.Background(), e.msg(t, "a@n1", "refused")); !errors.Is(err, diskFull) {
		t.Fatalf("Enqueue on a full disk: %v, want the disk's error", err)
	}
	if err := e.Ack("a@n1", seqs); !errors.Is(err, diskFull) {
		t.Fatalf("Ack on a full disk: %v, want the disk's error", err)
	}
	st := e.Stats()
	if st.CommitFailures != 2 {
		t.Fatalf("CommitFailures = %d, want 2", st.CommitFailures)
	}
	if st.Depth != 1 || len(e.head(t, "a@n1", 10)) != 1 {
		t.Fatalf("a failed commit changed the queue: depth %d", st.Depth)
	}

	restore()
	if err := e.Ack("a@n1", seqs); err != nil {
		t.Fatalf("Ack once the disk takes it: %v", err)
	}
	if st := e.Stats(); st.Depth != 0 || st.CommitFailures != 2 || st.Delivered != 1 {
		t.Fatalf("after the disk recovered: depth %d, %d commit failures, %d delivered; want 0, 2, 1", st.Depth, st.CommitFailures, st.Delivered)
	}
}

// PendingExcept subtracts only the given sequences still in the queue:
// not one acked, nor one a newer version of its coalesce key replaced.
func TestPendingExceptCountsWhatIsStillQueued(t *testing.T) {
	e := open(t, nil)
	seqs := e.send(t, "a@n1", "m1", "m2", "m3")
	v1 := e.msg(t, "a@n1", "v1")
	v1.Envelope.Conflict, v1.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "k"
	e.put(t, v1)
	v2 := e.msg(t, "a@n1", "v2")
	v2.Envelope.Conflict, v2.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "k"
	e.put(t, v2)
	if err := e.Ack("a@n1", seqs[:1]); err != nil {
		t.Fatal(err)
	}
	all := append(slices.Clone(seqs), v1.GetEnvelope().GetSequence(), v2.GetEnvelope().GetSequence())
	// PendingExcept subtracts only those still queued: m2, m3 and v2 of
	// the three queued, none left besides them.
	if n := e.PendingExcept("a@n1", all); n != 0 {
		t.Fatalf("PendingExcept(all) = %d, want 0", n)
	}
	if n := e.PendingExcept("a@n1", seqs[:2]); n != 2 {
		t.Fatalf("PendingExcept(m1 acked, m2) = %d, want 2 (m3, v2)", n)
	}
	if n := e.PendingExcept("nobody@n9", all); n != 0 {
		t.Fatalf("PendingExcept for a recipient with no queue = %d, want 0", n)
	}
}

package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// NoteVersion notes a version before its message is delivered without
// being stored; when that delivery gets no verdict the message is stored
// under the same sequence, which its own note must not make superseded.
// An older version is; a failed note is reported, not kept for later.
func TestNoteVersionBeforeADirectAttempt(t *testing.T) {
	e := open(t, nil)
	lo, _ := e.ReserveSequence()
	hi, _ := e.ReserveSequence()
	msg := func(seq uint64) *pb.StoredMessage {
		return &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: seq, Conflict: pb.Envelope_OVERWRITE, CoalesceKey: "k"}}
	}
	if err := e.NoteVersion(context.Background(), "a@n1", "k", hi); err != nil {
		t.Fatal(err)
	}
	if r := e.put(t, msg(hi)); r != outbox.Queued {
		t.Fatalf("the noted version itself: %v, want Queued", r)
	}
	if r := e.put(t, msg(lo)); r != outbox.Superseded {
		t.Fatalf("an older version: %v, want Superseded", r)
	}
	restore, _ := faults.FailCommits(e.path, errors.New("write outbox.db: no space left on device"))
	err := e.NoteVersion(context.Background(), "a@n1", "k2", hi+1)
	restore()
	if err == nil {
		t.Fatal("NoteVersion with the disk full: nil, want the commit's error")
	}
	if err := e.Close(); err != nil { // nothing kept to write, nothing closed twice
		t.Fatal(err)
	}
}

// Versions dead-lettered without ever being queued (DeadLetter, as for a
// message refused on its direct attempt) are noted like queued ones: a
// Replay of them all replays the newest alone, and the older stays in the
// dead-letter queue as superseded. Unnoted, the older was replayed first,
// at a new sequence above the newer's, which was then refused for good.
func TestDeadLetteredVersionsReplayTheNewest(t *testing.T) {
	e := open(t, nil)
	for _, v := range []string{"v1", "v2"} {
		seq, _ := e.ReserveSequence()
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: v, Sequence: seq, Conflict: pb.Envelope_OVERWRITE, CoalesceKey: "k"}}
		if err := e.DeadLetter(context.Background(), sm, "rejected: not ready"); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := e.Replay(outbox.DLQFilter{Recipient: "a@n1"}); n != 1 || err != nil {
		t.Fatalf("replay of both versions: %d, %v; want 1 and no error", n, err)
	}
	dl, err := e.DeadLetters(outbox.DLQFilter{Recipient: "a@n1"})
	if err != nil || len(dl) != 1 || dl[0].Message.GetEnvelope().GetType() != "v1" {
		t.Fatalf("left in the dead-letter queue: %v (%v), want v1 alone", dl, err)
	}
	head, _, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 10})
	if err != nil || len(head) != 1 || head[0].GetEnvelope().GetType() != "v2" {
		t.Fatalf("queued after the replay: %v (%v), want v2 alone", head, err)
	}
}

package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Edits' contract for a reader ahead: "finds Edits even and unchanged
// since before that read, knows that a Head now would return the same
// messages first". So once a Head can see an edit (here: a coalescing
// replacement), Edits must already have moved: bbolt's readers see a
// commit once its meta page is written, before the fsync returns.
func TestEditsMovesBeforeAnEditIsVisible(t *testing.T) {
	e := open(t, nil)
	ow := func(typ string) *pb.StoredMessage {
		sm := e.msg(t, "a@n1", typ)
		sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "k"
		return sm
	}
	const rounds = 50
	hits := 0
	for range rounds {
		v1 := ow("v1")
		if _, err := e.Enqueue(context.Background(), v1); err != nil {
			t.Fatal(err)
		}
		old := v1.GetEnvelope().GetSequence()
		before := e.Edits()
		done := make(chan error, 1)
		go func() { _, err := e.Enqueue(context.Background(), ow("v2")); done <- err }()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			msgs, _, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 100})
			if err != nil {
				t.Fatal(err)
			}
			replaced := true
			for _, m := range msgs {
				if m.GetEnvelope().GetSequence() == old {
					replaced = false
				}
			}
			if replaced {
				if e.Edits() == before { // read after the Head that saw the replacement
					hits++
				}
				break
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		msgs, _, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 100})
		if err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for _, m := range msgs {
			seqs = append(seqs, m.GetEnvelope().GetSequence())
		}
		if err := e.Ack("a@n1", seqs); err != nil {
			t.Fatal(err)
		}
	}
	if hits > 0 {
		t.Fatalf("in %d of %d replacements, a Head already returned the queue without the replaced version while Edits had not moved", hits, rounds)
	}
}

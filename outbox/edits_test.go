package outbox_test

import (
	"context"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Edits moves with every commit that changes a queue other than by
// appending or acknowledging, and only then: a reader ahead of Head
// relies on both.
func TestEditsCountsChangesOtherThanAppendsAndAcks(t *testing.T) {
	e := open(t, nil)
	enqueue := func(sm *pb.StoredMessage) uint64 {
		t.Helper()
		if _, err := e.Enqueue(context.Background(), sm); err != nil {
			t.Fatal(err)
		}
		return sm.GetEnvelope().GetSequence()
	}
	ow := func(typ string) *pb.StoredMessage {
		sm := e.msg(t, "a@n1", typ)
		sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "k"
		return sm
	}
	var seqs []uint64
	steps := []struct {
		name  string
		do    func()
		moves bool
	}{
		{"append", func() { seqs = append(seqs, enqueue(e.msg(t, "a@n1", "m1")), enqueue(e.msg(t, "a@n1", "m2"))) }, false},
		{"append a first version", func() { enqueue(ow("v1")) }, false},
		{"ack", func() {
			if err := e.Ack("a@n1", seqs[:1]); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"defer", func() { e.Defer("a@n1", e.ElapsedMs()+1000); e.WakeNode("n1") }, false},
		{"replace a version", func() { enqueue(ow("v2")) }, true},
		{"record a failed attempt", func() {
			if _, _, err := e.Fail("a@n1", seqs[1], outbox.Failure{Reason: "boom", Counts: true}); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"dead-letter", func() {
			if _, _, err := e.Fail("a@n1", seqs[1], outbox.Failure{Reason: "poison", Permanent: true}); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"replay", func() {
			if n, err := e.Replay(outbox.DLQFilter{Recipient: "a@n1"}); err != nil || n != 1 {
				t.Fatalf("replay: %d %v", n, err)
			}
		}, true},
	}
	for _, s := range steps {
		before := e.Edits()
		s.do()
		enqueue(e.msg(t, "flush@n2", "f")) // an append, committed after what s did (asynchronous ops too)
		if moved := e.Edits() != before; moved != s.moves {
			t.Errorf("%s: Edits moved %v, want %v", s.name, moved, s.moves)
		}
	}
}

// Every sequence handed out lies below HandedOutBelow, also after a
// reopen, and the next one is at or above it.
func TestHandedOutBelow(t *testing.T) {
	e := open(t, nil)
	var last uint64
	for range 3 {
		seq, err := e.ReserveSequence()
		if err != nil {
			t.Fatal(err)
		}
		if b := e.HandedOutBelow(); b <= seq {
			t.Fatalf("HandedOutBelow %d after handing out %d", b, seq)
		}
		last = seq
	}
	e.reopen(t, nil)
	b := e.HandedOutBelow()
	if b <= last {
		t.Fatalf("after reopen HandedOutBelow %d, at most the %d handed out before", b, last)
	}
	if seq, err := e.ReserveSequence(); err != nil || seq < b {
		t.Fatalf("next sequence %d (%v) below HandedOutBelow %d", seq, err, b)
	}
}

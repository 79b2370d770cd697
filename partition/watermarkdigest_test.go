package partition_test

import (
	"context"
	"slices"
	"testing"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/partition"
)

// A sender restored from a backup and restarted before its queued messages
// went out counts every stored message as sent. When its first emission
// stops below the receiver's watermark (here its batch size; the
// receiver's room does the same), that watermark is at most what it
// counts as sent, so by itself it shows nothing, and the DUPLICATEs of
// the new messages under it would be acked as copies. The receipts also
// say the digest of the message that ran at the watermark, and the stream
// holds another one there: a restore. Every message runs in a new epoch,
// in order; none is taken for a copy.
func TestEmissionBelowTheWatermarkFindsTheRestoreByItsDigest(t *testing.T) {
	var rcfg partition.Config
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 2; rcfg = *c })
	sms := make([]*pb.StoredMessage, 4)
	for i, typ := range names("m", 4) {
		sms[i] = rg.msg("a@n1", typ)
	}
	rg.storeAll(t, sms...)
	at := sms[2].GetEnvelope().GetSequence()
	if at == 0 {
		t.Fatal("no sequence handed out")
	}
	rg.fake.set(func(f *fake) {
		// Before the restore, the receiver ran another message under m002's
		// sequence.
		k := "a@n1\x000"
		f.wm[k], f.digest[k] = at, pb.StreamDigest(&pb.Envelope{Type: "before the restore", Sequence: at})
	})
	rg.restartRelay(t, rcfg) // the restart: everything stored counts as sent
	testutil.WaitFor(t, wait, "delivered", func() bool { return rg.store.Stats().Depth == 0 })
	if st := rg.relay.Stats(); st.Restores != 1 {
		t.Fatalf("restores %d, want 1; ran %v", st.Restores, rg.fake.ranTypes("a@n1"))
	}
	if got, want := rg.fake.ranTypes("a@n1"), names("m", 4); !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}

// The same emission from a sender that was not restored: every message
// ran, their receipts were lost, and after a restart the stream sends
// them again in emissions below the watermark. The digest the receipts
// say is that of the message the stream holds at the watermark: copies,
// acked, in the stream's epoch, and nothing runs twice.
func TestEmissionBelowTheWatermarkOfItsOwnMessageIsAck(t *testing.T) {
	var rcfg partition.Config
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4; rcfg = *c })
	rg.runFirstEmission(func(_ int, e *pb.Envelope, _ *pb.Receipt) *pb.Receipt {
		return heldBack(e) // ran; its receipt held back until the restart
	})
	rg.queue(t, "a@n1", names("m", 4)...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "first emission", func() bool { return rg.fake.ranCount("a@n1") == 4 })
	rcfg.BatchSize = 2
	rg.restartRelay(t, rcfg)
	rg.relay.NodeAlive("n1") // the first emission's deferral ends now
	rg.noRestore(t, names("m", 4))
	if c := rg.fake.codes()[pb.Receipt_DUPLICATE]; c == 0 {
		t.Fatal("no copy was answered DUPLICATE: the case did not happen")
	}
}

// Sequences belong to the whole outbox: the restored outbox may have given
// the receiver's watermark to a message for another actor, and after a
// restart the stream counts it as sent. A receipt whose watermark, with a
// digest, is a sequence the outbox holds for another recipient gives the
// restore away: a sequence is handed out once, so an honest stream never
// sent it.
func TestWatermarkHeldForAnotherRecipientIsARestore(t *testing.T) {
	var rcfg partition.Config
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 2; rcfg = *c })
	rg.queue(t, "a@n1", "m000", "m001")
	other := rg.msg("b@n1", "x")
	rg.storeAll(t, other)
	rg.queue(t, "a@n1", "m002")
	at := other.GetEnvelope().GetSequence()
	rg.fake.set(func(f *fake) {
		k := "a@n1\x000"
		f.wm[k], f.digest[k] = at, pb.StreamDigest(&pb.Envelope{Type: "before the restore", Sequence: at})
		// The evidence is the other recipient's message in the outbox: it
		// stays there until a@n1's stream is through (were it delivered
		// and gone first, nothing would show the restore, and a@n1's first
		// messages would be taken for copies).
		f.intercept = func(_ context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if envs[0].GetRecipient() != "b@n1" || slices.Contains(rg.fake.ranTypes("a@n1"), "m002") {
				return nil, nil, false
			}
			rcs := make([]*pb.Receipt, len(envs))
			for i, e := range envs {
				rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_CAPACITY, RetryAfterMs: 20}
			}
			return rcs, nil, true
		}
	})
	rg.restartRelay(t, rcfg)
	testutil.WaitFor(t, wait, "delivered", func() bool { return rg.store.Stats().Depth == 0 })
	if st := rg.relay.Stats(); st.Restores != 1 {
		t.Fatalf("restores %d, want 1; ran %v", st.Restores, rg.fake.ranTypes("a@n1"))
	}
	if got, want := rg.fake.ranTypes("a@n1"), names("m", 3); !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}

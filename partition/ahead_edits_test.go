package partition_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// TestReadAheadNotSentAfterReplacement, with the stream's next emission
// made right after the replacement became visible to Head (its commit's
// meta page written), before its fsync has returned: what was read ahead
// must not look current then (Edits is odd while such a commit is under
// way), or the replaced version v1 would be sent although a Head at that
// moment returns m7 m8 v2.
func TestReadAheadNotSentAfterAReplacementBeingCommitted(t *testing.T) {
	const rounds = 50
	for i := range rounds {
		rg := aheadRig(t, nil)
		ow := func(typ string) *pb.StoredMessage {
			sm := rg.msg("a@n1", typ)
			sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "price"
			return sm
		}
		rg.storeAll(t, rg.msg("a@n1", "m1"), rg.msg("a@n1", "m2"), rg.msg("a@n1", "m3"), rg.msg("a@n1", "m4"),
			rg.msg("a@n1", "m5"), ow("v1"), rg.msg("a@n1", "m7"), rg.msg("a@n1", "m8"))
		stored := make(chan error, 1)
		holdFirst(t, rg, "a@n1", func() {
			go func() {
				stored <- rg.relay.Store(context.Background(), []*pb.StoredMessage{ow("v2")})[0]
			}()
			// Let the emission go as soon as a Head no longer returns v1
			// (a tight poll: the state lasts about one fsync).
			deadline := time.Now().Add(wait)
			for time.Now().Before(deadline) {
				msgs, _, err := rg.store.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 100})
				if err != nil {
					t.Error(err)
					return
				}
				if !slices.ContainsFunc(msgs, func(m *pb.StoredMessage) bool { return m.GetEnvelope().GetType() == "v1" }) {
					return
				}
			}
			t.Error("v1 never replaced")
		})
		rg.relay.Start()
		if err := <-stored; err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
		if got, want := rg.fake.ranTypes("a@n1"), []string{"m1", "m2", "m3", "m4", "m5", "m7", "m8", "v2"}; !slices.Equal(got, want) {
			t.Fatalf("round %d: ran %v, want %v: v1 was replaced (a Head no longer returned it) before the emission that sent it was made (emissions read ahead %d)",
				i, got, want, rg.relay.Stats().ReadAhead)
		}
		_ = rg.relay.Close()
	}
}

// The same window with an operator's DropQueue: once a Head finds the
// queue empty (every message moved to the dead-letter queue as dropped),
// the stream's next emission must not send what it read ahead before the
// drop, or messages recorded as dropped would run (and run a second time
// if the operator replays them).
func TestReadAheadNotSentAfterADropBeingCommitted(t *testing.T) {
	const rounds = 50
	for i := range rounds {
		rg := aheadRig(t, nil)
		msgs := names("m", 8)
		rg.queue(t, "a@n1", msgs...)
		dropped := make(chan error, 1)
		holdFirst(t, rg, "a@n1", func() {
			go func() {
				_, err := rg.store.DropQueue("a@n1", "operator")
				dropped <- err
			}()
			deadline := time.Now().Add(wait)
			for time.Now().Before(deadline) {
				head, _, err := rg.store.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 100})
				if err != nil {
					t.Error(err)
					return
				}
				if len(head) == 0 {
					return // the drop is visible: from now on nothing of the queue may be sent
				}
			}
			t.Error("the drop never became visible")
		})
		rg.relay.Start()
		if err := <-dropped; err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
		testutil.WaitFor(t, wait, "relay idle", func() bool { return rg.relay.Stats().InFlight == 0 })
		if got := rg.fake.ranTypes("a@n1"); len(got) > 4 {
			t.Fatalf("round %d: ran %v: %v were dropped (a Head returned nothing) before the emission that sent them was made (emissions read ahead %d)",
				i, got, got[4:], rg.relay.Stats().ReadAhead)
		}
		_ = rg.relay.Close()
	}
}

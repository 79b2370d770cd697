package partition_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

// aheadRig drains in emissions of 4, with room for several at a time.
func aheadRig(t *testing.T, smut func(*outbox.Config)) *rig {
	return newRig(t, smut, func(c *partition.Config) {
		c.BatchSize = 4
		c.Limiter = partition.LimiterConfig{Initial: 64, Min: 1, Max: 64}
	})
}

// holdFirst makes the first emission wait until the stream's next one has
// been read ahead, then runs during(), then lets the fake receive it.
func holdFirst(t *testing.T, rg *rig, rcpt string, during func()) {
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, _ []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n == 0 {
				testutil.WaitFor(t, wait, "read ahead", func() bool { return rg.relay.AheadRead(rcpt) })
				during()
			}
			return nil, nil, false
		}
	})
}

// While an emission awaits its receipts, the next one is read; a drain
// sends what was read ahead, in order, once.
func TestReadAheadDrainsInOrder(t *testing.T) {
	rg := aheadRig(t, nil)
	msgs := names("m", 22)
	rg.queue(t, "a@n1", msgs...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v", got)
	}
	if st := rg.relay.Stats(); st.ReadAhead < 3 {
		t.Fatalf("%d of %d emissions read ahead, want most of the 6", st.ReadAhead, st.Batches)
	}
}

// A message read ahead and then replaced by a newer version of its
// coalesce key is not sent: the next emission is what Head returns now.
func TestReadAheadNotSentAfterReplacement(t *testing.T) {
	rg := aheadRig(t, nil)
	ow := func(typ string) *pb.StoredMessage {
		sm := rg.msg("a@n1", typ)
		sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "price"
		return sm
	}
	rg.storeAll(t, rg.msg("a@n1", "m1"), rg.msg("a@n1", "m2"), rg.msg("a@n1", "m3"), rg.msg("a@n1", "m4"),
		rg.msg("a@n1", "m5"), ow("v1"), rg.msg("a@n1", "m7"), rg.msg("a@n1", "m8"))
	holdFirst(t, rg, "a@n1", func() { rg.storeAll(t, ow("v2")) })
	rg.relay.Start()
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	if got, want := rg.fake.ranTypes("a@n1"), []string{"m1", "m2", "m3", "m4", "m5", "m7", "m8", "v2"}; !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v (v1 was replaced before it was sent)", got, want)
	}
}

// A message read ahead whose TTL runs out before its emission is given up
// as Head would, not sent with no time left.
func TestReadAheadNotSentAfterItsTTL(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	rg := aheadRig(t, func(c *outbox.Config) { c.Clock = clk })
	short := rg.msg("a@n1", "short")
	short.Envelope.TtlMs = 5_000
	rg.storeAll(t, rg.msg("a@n1", "m1"), rg.msg("a@n1", "m2"), rg.msg("a@n1", "m3"), rg.msg("a@n1", "m4"),
		rg.msg("a@n1", "m5"), short, rg.msg("a@n1", "m7"), rg.msg("a@n1", "m8"))
	holdFirst(t, rg, "a@n1", func() { clk.Advance(6 * time.Second) })
	rg.relay.Start()
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	if got, want := rg.fake.ranTypes("a@n1"), []string{"m1", "m2", "m3", "m4", "m5", "m7", "m8"}; !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v (short's TTL ran out before it was sent)", got, want)
	}
	if st := rg.store.Stats(); st.DLQDepth != 1 {
		t.Fatalf("dead letters %d, want short's expiry", st.DLQDepth)
	}
}

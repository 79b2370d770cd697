package partition_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

func TestPartitionOf(t *testing.T) {
	tests := []struct {
		recipient string
		parts     int
		want      int
	}{
		{"a@n1", 1, 0},
		{"a@n1", 0, 0},
		{"a@n1", -3, 0},
		{"", 4, int(2166136261 % 4)}, // FNV-1a offset basis
	}
	for _, tt := range tests {
		if got := partition.PartitionOf(tt.recipient, tt.parts); got != tt.want {
			t.Errorf("PartitionOf(%q, %d) = %d, want %d", tt.recipient, tt.parts, got, tt.want)
		}
	}
	hits := make([]int, 4)
	for _, a := range names("actor", 4000) {
		p := partition.PartitionOf(a+"@n1", 4)
		if p != partition.PartitionOf(a+"@n1", 4) {
			t.Fatal("not deterministic")
		}
		hits[p]++
	}
	for i, h := range hits {
		if h < 700 {
			t.Fatalf("partition %d got %d of 4000: %v", i, h, hits)
		}
	}
}

func TestConfigAndNew(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*partition.Config)
	}{
		{"partitions", func(c *partition.Config) { c.Partitions = 0 }},
		{"too many partitions", func(c *partition.Config) { c.Partitions = 2000 }},
		{"batch", func(c *partition.Config) { c.BatchSize = 0 }},
		{"batch bytes", func(c *partition.Config) { c.BatchBytes = 0 }},
		{"recheck", func(c *partition.Config) { c.DownRecheck = 0 }},
		{"maxdue", func(c *partition.Config) { c.MaxDue = 0 }},
		{"maxackpending", func(c *partition.Config) { c.MaxAckPending = 0 }},
		{"deliver timeout", func(c *partition.Config) { c.DeliverTimeout = 0 }},
		{"direct timeout", func(c *partition.Config) { c.DirectTimeout = 0 }},
		{"backoff", func(c *partition.Config) { c.Backoff.Cap = c.Backoff.Base / 2 }},
		{"limiter", func(c *partition.Config) { c.Limiter.Initial = c.Limiter.Max + 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := partition.DefaultConfig()
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			tt.mut(&c)
			if err := c.Validate(); !errors.Is(err, partition.ErrBadConfig) {
				t.Fatalf("Validate = %v", err)
			}
		})
	}
	// A nil logger discards, as in every package of the module: a relay
	// with one runs (the rig's store and fake are reused).
	rg := newRig(t, nil, func(c *partition.Config) { c.Logger = nil })
	rg.relay.Start()
	if _, err := partition.New(partition.DefaultConfig(), nil, newFake()); !errors.Is(err, partition.ErrNilDependency) {
		t.Fatalf("New(nil store) = %v", err)
	}
}

// checkEmissions checks the shape of every emission the fake saw: one
// stream per call, the first message with PrevSequence 0, each later one
// naming the one before it, sequences increasing.
func checkEmissions(tb testing.TB, calls []call) {
	tb.Helper()
	for i, c := range calls {
		for j, e := range c.envs {
			want := uint64(0)
			if j > 0 {
				want = c.envs[j-1].GetSequence()
			}
			if e.GetPrevSequence() != want {
				tb.Fatalf("call %d message %d: prev_sequence %d, want %d", i, j, e.GetPrevSequence(), want)
			}
			if j > 0 && e.GetSequence() <= want {
				tb.Fatalf("call %d: sequence %d after %d", i, e.GetSequence(), want)
			}
		}
	}
}

// Each stream drains in sequence order, in emissions chained by
// prev_sequence; every handler runs exactly once.
func TestDrainInOrderWithChain(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 16 })
	a, b := names("a", 300), names("b", 50)
	rg.queue(t, "a@n1", a...)
	rg.queue(t, "b@n2", b...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "all delivered", func() bool {
		return rg.fake.ranCount("a@n1") == len(a) && rg.fake.ranCount("b@n2") == len(b)
	})
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, a) {
		t.Fatalf("order broken: %v", got[:10])
	}
	if got := rg.fake.ranTypes("b@n2"); !slices.Equal(got, b) {
		t.Fatalf("order broken: %v", got[:10])
	}
	calls := rg.fake.callsSnapshot()
	checkEmissions(t, calls)
	chained := false
	for _, c := range calls {
		chained = chained || len(c.envs) > 1
		for _, e := range c.envs {
			if e.GetAttempt() != 1 || e.GetReceipt() != pb.Envelope_RECEIPT_PROCESSED || e.GetMsgId() == "" {
				t.Fatalf("wire envelope %+v", e)
			}
		}
	}
	if !chained {
		t.Fatal("no emission carried more than one message")
	}
	if c := rg.fake.codes(); c[pb.Receipt_DUPLICATE] != 0 || c[pb.Receipt_OUT_OF_ORDER] != 0 {
		t.Fatalf("receipts %v: a message was sent twice or out of order", c)
	}
	testutil.WaitFor(t, wait, "store empty and acks counted", func() bool {
		return rg.store.Stats().Depth == 0 && rg.relay.Stats().Delivered == 350
	})
	if st := rg.relay.Stats(); st.Failed != 0 || st.Direct != 0 {
		t.Fatalf("relay stats %+v", st)
	}
	// Messages stored while the relay runs still arrive in order.
	more := names("c", 100)
	rg.queue(t, "a@n1", more...)
	testutil.WaitFor(t, wait, "late ones", func() bool { return rg.fake.ranCount("a@n1") == 400 })
	if got := rg.fake.ranTypes("a@n1")[300:]; !slices.Equal(got, more) {
		t.Fatalf("late order %v", got)
	}
}

// An emission of large messages stops at BatchBytes of stored bytes
// (one message always goes), in order, each message once.
func TestEmissionBoundedByBytes(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 64; c.BatchBytes = 5000 })
	big := make([]string, 20)
	for i := range big {
		big[i] = fmt.Sprintf("%02d%s", i, strings.Repeat("x", 2000))
	}
	rg.queue(t, "a@n1", big...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "all delivered", func() bool { return rg.fake.ranCount("a@n1") == len(big) })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, big) {
		t.Fatal("order broken")
	}
	calls := rg.fake.callsSnapshot()
	checkEmissions(t, calls)
	for _, c := range calls {
		if len(c.envs) > 2 {
			t.Fatalf("an emission of %d messages of 2 KB each, bound 5000 bytes", len(c.envs))
		}
	}
}

// A stream never has two emissions out at once, even with many streams of
// one node and messages arriving throughout.
func TestOneUnreceiptedEmissionPerStream(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 3 })
	slow := make(chan struct{})
	rg.fake.set(func(f *fake) {
		f.intercept = func(ctx context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			select { // every emission waits a moment, so overlaps would show
			case <-slow:
			case <-time.After(time.Millisecond):
			}
			return nil, nil, false
		}
	})
	rg.relay.Start()
	rcpts := []string{"a@n1", "b@n1", "c@n1"}
	for i := range 30 {
		for _, r := range rcpts {
			rg.queue(t, r, fmt.Sprint(r, i))
		}
	}
	testutil.WaitFor(t, wait, "all delivered", func() bool {
		return rg.fake.ranCount("a@n1") == 30 && rg.fake.ranCount("b@n1") == 30 && rg.fake.ranCount("c@n1") == 30
	})
	rg.fake.mu.Lock()
	defer rg.fake.mu.Unlock()
	for _, r := range rcpts {
		if m := rg.fake.maxFlight[r]; m != 1 {
			t.Fatalf("%s had %d emissions out at once", r, m)
		}
	}
}

// Ack pipelining: once every receipt of an emission is positive, the
// stream's next emission goes while that Ack still commits (up to
// MaxAckPending of them), starting after the acked messages.
func TestAckPipelining(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 2; c.MaxAckPending = 4 })
	msgs := names("m", 6)
	rg.queue(t, "a@n1", msgs...)
	release := stall(t, rg.store) // every Ack waits from now on
	rg.relay.Start()
	testutil.WaitFor(t, wait, "three emissions while no ack can commit", func() bool { return rg.fake.callCount() == 3 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v", got)
	}
	if rg.store.Pending("a@n1") != 6 {
		t.Fatalf("pending %d: acks committed while the committer was stalled", rg.store.Pending("a@n1"))
	}
	calls := rg.fake.callsSnapshot()
	checkEmissions(t, calls)
	for i := 1; i < len(calls); i++ {
		if calls[i].envs[0].GetSequence() <= calls[i-1].envs[len(calls[i-1].envs)-1].GetSequence() {
			t.Fatalf("emission %d starts at %d, not after the previous one", i, calls[i].envs[0].GetSequence())
		}
	}
	release()
	testutil.WaitFor(t, wait, "acks committed", func() bool { return rg.store.Pending("a@n1") == 0 })
	if c := rg.fake.codes(); c[pb.Receipt_DUPLICATE] != 0 {
		t.Fatalf("a message being acked was sent again: %v", c)
	}
}

// MaxAckPending bounds the emissions whose Ack is still committing.
func TestAckPipeliningBounded(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 1; c.MaxAckPending = 2 })
	rg.queue(t, "a@n1", names("m", 6)...)
	release := stall(t, rg.store)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "two emissions", func() bool { return rg.fake.callCount() == 2 })
	// The loop runs again after each emission; give it a few rounds and
	// check that a third did not go.
	for i := 0; i < 5; i++ {
		before := rg.relay.Stats().Iterations
		rg.relay.Notify("a@n1")
		testutil.WaitFor(t, wait, "a loop iteration", func() bool { return rg.relay.Stats().Iterations > before })
	}
	if n := rg.fake.callCount(); n != 2 {
		t.Fatalf("%d emissions with 2 acks pending, MaxAckPending 2", n)
	}
	release()
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Pending("a@n1") == 0 })
}

func TestIdleRelayDoesNoWork(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "first iterations", func() bool { return rg.relay.Stats().Iterations >= 4 })
	before := rg.relay.Stats().Iterations
	<-time.After(300 * time.Millisecond) // observing that nothing happens needs a window
	if it := rg.relay.Stats().Iterations; it != before {
		t.Fatalf("idle relay iterated %d times in 300ms", it-before)
	}
	rg.queue(t, "a@n1", "x")
	testutil.WaitFor(t, wait, "delivered and acked", func() bool {
		return rg.fake.ranCount("a@n1") == 1 && rg.store.Pending("a@n1") == 0
	})
	if it := rg.relay.Stats().Iterations - before; it > 20 {
		t.Fatalf("one message cost %d iterations", it)
	}
	// The emission's end wakes every partition once (4), possibly just
	// after the ack this test waited for; after that, nothing.
	before = rg.relay.Stats().Iterations
	<-time.After(300 * time.Millisecond)
	if it := rg.relay.Stats().Iterations; it-before > 4 {
		t.Fatalf("relay kept iterating after the drain: %d in 300ms", it-before)
	}
	before = rg.relay.Stats().Iterations
	<-time.After(300 * time.Millisecond)
	if it := rg.relay.Stats().Iterations; it != before {
		t.Fatalf("relay kept iterating after the drain: %d in the second 300ms", it-before)
	}
}

// A peer that is down is not sent to and nothing is counted; NodeAlive
// drains it at once (DownRecheck is an hour here).
func TestPeerDownThenNodeAliveDrainsAtOnce(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.DownRecheck = time.Hour })
	rg.fake.set(func(f *fake) { f.down["n1"] = true })
	msgs := names("m", 40)
	rg.queue(t, "a@n1", msgs...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "deferred", func() bool { return rg.relay.Stats().Deferred >= 1 })
	rg.queue(t, "a@n1", "late")
	if n := rg.fake.callCount(); n != 0 {
		t.Fatalf("%d Deliver calls to a down peer", n)
	}
	rg.fake.set(func(f *fake) { f.down["n1"] = false })
	rg.relay.NodeAlive("n1")
	testutil.WaitFor(t, 5*time.Second, "drain after NodeAlive", func() bool { return rg.fake.ranCount("a@n1") == 41 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, append(msgs, "late")) {
		t.Fatalf("order %v", got)
	}
	if st := rg.store.Stats(); st.DLQDepth != 0 || st.Retries != 0 {
		t.Fatalf("store stats %+v: something was counted", st)
	}
}

// Messages in flight to one node never exceed its AIMD limit.
func TestConcurrencyBoundedPerNode(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) {
		c.BatchSize = 2
		c.Limiter = partition.LimiterConfig{Initial: 3, Min: 1, Max: 3}
	})
	for _, r := range names("r", 20) {
		rg.queue(t, r+"@n1", "a", "b", "c")
	}
	rg.relay.Start()
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	rg.fake.mu.Lock()
	peak := rg.fake.maxNode["n1"]
	rg.fake.mu.Unlock()
	if peak > 3 || peak == 0 {
		t.Fatalf("peak in-flight messages to n1 = %d, limit 3", peak)
	}
	if st := rg.relay.Stats(); st.InFlight != 0 || st.LimitByPeer["n1"] != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// Store is the fan-out: every message stored, none attempted directly,
// the relay delivers each stream in order.
func TestStoreFanOut(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.relay.Start()
	var sms []*pb.StoredMessage
	for _, r := range names("r", 50) {
		sms = append(sms, rg.msg(r+"@n1", "first"), rg.msg(r+"@n1", "second"))
	}
	sms = append(sms, &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "bad"}})
	errs := rg.relay.Store(context.Background(), sms)
	for i, err := range errs[:100] {
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
	}
	if !errors.Is(errs[100], outbox.ErrBadRecipient) {
		t.Fatalf("bad recipient: %v", errs[100])
	}
	testutil.WaitFor(t, wait, "fan-out delivered", func() bool { return rg.store.Stats().Depth == 0 })
	for _, r := range names("r", 50) {
		if got := rg.fake.ranTypes(r + "@n1"); !slices.Equal(got, []string{"first", "second"}) {
			t.Fatalf("%s got %v", r, got)
		}
	}
	if st := rg.relay.Stats(); st.Direct != 0 {
		t.Fatalf("fan-out made %d direct attempts", st.Direct)
	}
	_ = rg.relay.Close()
	if errs := rg.relay.Store(context.Background(), sms[:1]); !errors.Is(errs[0], partition.ErrClosed) {
		t.Fatalf("Store after Close: %v", errs[0])
	}
}

// ForgetPeer drops an idle peer's limiter; a new one starts at Initial.
func TestForgetPeer(t *testing.T) {
	rg := newRig(t, nil, nil)
	l := rg.relay.Limiter("n1")
	l.OnCapacity()
	rg.relay.ForgetPeer("n1")
	if got := rg.relay.Limiter("n1").Limit(); got != partition.DefaultLimiterConfig().Initial {
		t.Fatalf("limit after ForgetPeer %d", got)
	}
	held := rg.relay.Limiter("n2")
	held.TryAcquire(1)
	rg.relay.ForgetPeer("n2") // busy: kept
	if rg.relay.Limiter("n2") != held {
		t.Fatal("a limiter with slots held was forgotten")
	}
}

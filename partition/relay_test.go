package partition_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

const wait = 10 * time.Second

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
	for _, a := range seq("actor", 4000) {
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
		{"batch", func(c *partition.Config) { c.BatchSize = 0 }},
		{"recheck", func(c *partition.Config) { c.DownRecheck = 0 }},
		{"maxdue", func(c *partition.Config) { c.MaxDue = 0 }},
		{"maxackpending", func(c *partition.Config) { c.MaxAckPending = 0 }},
		{"logger", func(c *partition.Config) { c.Logger = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := partition.DefaultConfig()
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			tt.mut(&c)
			if err := c.Validate(); !errors.Is(err, partition.ErrInvalidConfig) {
				t.Fatalf("Validate = %v", err)
			}
		})
	}
	if _, err := partition.New(partition.DefaultConfig(), nil, newFake()); !errors.Is(err, partition.ErrNilDependency) {
		t.Fatalf("New(nil store) = %v", err)
	}
}

func TestDrainInOrderWithChain(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 16 })
	a, b := seq("a", 300), seq("b", 50)
	rg.send(t, "a@n1", a...)
	rg.send(t, "b@n2", b...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "all delivered", func() bool {
		return rg.fake.count("a@n1") == len(a) && rg.fake.count("b@n2") == len(b)
	})
	if got := rg.fake.processedTypes("a@n1"); !slices.Equal(got, a) {
		t.Fatalf("order broken: %v", got[:10])
	}
	rg.fake.mu.Lock()
	got := slices.Clone(rg.fake.got["a@n1"])
	rg.fake.mu.Unlock()
	for i, e := range got {
		if e.GetAttempt() != 1 {
			t.Fatalf("msg %d attempt %d", i, e.GetAttempt())
		}
		// Batches are cut by BatchSize and by the AIMD limit; inside one
		// the chain links each message to the one before.
		if e.GetPrevSequence() != 0 && e.GetPrevSequence() != got[i-1].GetSequence() {
			t.Fatalf("msg %d prev_sequence %d (previous seq %d)", i, e.GetPrevSequence(), got[max(i-1, 0)].GetSequence())
		}
	}
	if got[0].GetPrevSequence() != 0 || !slices.ContainsFunc(got, func(e *pb.Envelope) bool { return e.GetPrevSequence() != 0 }) {
		t.Fatal("batches not chained")
	}
	testutil.WaitFor(t, wait, "store empty", func() bool { return rg.store.Stats().Depth == 0 })
	// Delivered counts after the Ack returned, a moment after the store
	// emptied.
	testutil.WaitFor(t, wait, "acks counted", func() bool { return rg.relay.Stats().Delivered >= 350 })
	if st := rg.relay.Stats(); st.Delivered != 350 || st.Failed != 0 {
		t.Fatalf("relay stats %+v", st)
	}
	// Rule 1: messages enqueued while the relay runs still arrive in order.
	more := seq("c", 100)
	rg.send(t, "a@n1", more...)
	testutil.WaitFor(t, wait, "late ones", func() bool { return rg.fake.count("a@n1") == 400 })
	if got := rg.fake.processedTypes("a@n1")[300:]; !slices.Equal(got, more) {
		t.Fatalf("late order %v", got)
	}
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
	rg.send(t, "a@n1", "x")
	testutil.WaitFor(t, wait, "delivered", func() bool { return rg.fake.count("a@n1") == 1 })
	testutil.WaitFor(t, wait, "store empty", func() bool { return rg.store.Pending("a@n1") == 0 })
	if it := rg.relay.Stats().Iterations - before; it > 20 {
		t.Fatalf("one message cost %d iterations", it)
	}
}

func TestPeerDownNotCountedAndAliveDrainsAtOnce(t *testing.T) {
	// DownRecheck is an hour: only NodeAlive can make the drain happen
	// within the test's deadline (rule 4).
	rg := newRig(t, nil, func(c *partition.Config) { c.DownRecheck = time.Hour })
	rg.fake.set(func(f *fake) { f.down["n1"] = true })
	msgs := seq("m", 40)
	rg.send(t, "a@n1", msgs...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "deferred", func() bool { return rg.relay.Stats().Deferred >= 1 })
	rg.send(t, "a@n1", "late")
	head, err := rg.store.Head("a@n1", 100)
	if err != nil || len(head) != 41 {
		t.Fatalf("head %d %v", len(head), err)
	}
	for _, m := range head {
		if m.GetAttempts() != 0 {
			t.Fatalf("attempt counted while peer down: %+v", m)
		}
	}
	rg.fake.mu.Lock()
	calls := rg.fake.calls
	rg.fake.mu.Unlock()
	if calls != 0 {
		t.Fatalf("%d Deliver calls to a down peer", calls)
	}
	rg.fake.set(func(f *fake) { f.down["n1"] = false })
	rg.relay.NodeAlive("n1")
	testutil.WaitFor(t, 5*time.Second, "drain after NodeAlive", func() bool { return rg.fake.count("a@n1") == 41 })
	if got := rg.fake.processedTypes("a@n1"); !slices.Equal(got, append(msgs, "late")) {
		t.Fatalf("order %v", got)
	}
}

func TestCapacityAIMD(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
	var full atomic.Bool
	full.Store(true)
	rg.fake.set(func(f *fake) {
		f.behave["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
			if full.Load() {
				return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_CAPACITY, RetryAfterMs: 2}
			}
			return processed(e)
		}
	})
	rg.send(t, "a@n1", seq("m", 60)...)
	rg.relay.Start()
	lim := rg.store.Limiter("n1")
	testutil.WaitFor(t, wait, "limit falls to Min under CAPACITY", func() bool { return lim.Limit() == 1 })
	full.Store(false)
	testutil.WaitFor(t, wait, "all delivered", func() bool { return rg.fake.count("a@n1") == 60 })
	if l := lim.Limit(); l < 30 {
		t.Fatalf("limit %d did not rise back after 60 successes", l)
	}
	st := rg.store.Stats()
	if st.DLQDepth != 0 || st.DeadLettered != 0 {
		t.Fatalf("capacity rejections dead-lettered: %+v", st)
	}
	if got := rg.fake.processedTypes("a@n1"); !slices.Equal(got, seq("m", 60)) {
		t.Fatalf("order after capacity %v", got)
	}
}

func TestPoisonToDLQWhileOthersFlow(t *testing.T) {
	rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 3 }, nil)
	rg.fake.set(func(f *fake) {
		f.behave["p@n1"] = func(e *pb.Envelope) *pb.Receipt {
			if e.GetType() == "poison" {
				return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_TRANSIENT, Message: "handler failed"}
			}
			return processed(e)
		}
	})
	rg.send(t, "p@n1", "poison", "after1", "after2")
	rg.send(t, "q@n1", seq("q", 100)...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "others flow", func() bool { return rg.fake.count("q@n1") == 100 })
	testutil.WaitFor(t, wait, "poison dead-lettered, rest delivered", func() bool {
		return rg.fake.count("p@n1") == 2 && rg.store.Stats().DLQDepth == 1
	})
	dl, err := rg.store.DeadLetters(outbox.DLQFilter{Recipient: "p@n1"})
	if err != nil || len(dl) != 1 {
		t.Fatalf("dlq %v %v", dl, err)
	}
	if dl[0].Reason != "max attempts" || dl[0].Message.GetAttempts() != 3 || !strings.Contains(dl[0].Message.GetLastError(), "handler failed") {
		t.Fatalf("dead letter %+v", dl[0])
	}
	if got := rg.fake.processedTypes("p@n1"); !slices.Equal(got, []string{"after1", "after2"}) {
		t.Fatalf("p order %v", got)
	}
}

func TestNegativeReceipts(t *testing.T) {
	tests := []struct {
		name     string
		code     pb.Receipt_Code
		reason   string
		attempts uint32
	}{
		{"rejected goes straight to the DLQ", pb.Receipt_REJECTED, "rejected: fake", 0},
		{"expired goes straight to the DLQ", pb.Receipt_EXPIRED, "expired", 0},
		{"no such actor counts", pb.Receipt_NO_SUCH_ACTOR, "max attempts", 2},
		{"transient counts", pb.Receipt_TRANSIENT, "max attempts", 2},
		{"accepted is not processed", pb.Receipt_ACCEPTED, "max attempts", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 2 }, nil)
			rg.fake.set(func(f *fake) { f.behave["a@n1"] = code(tt.code, 0) })
			rg.send(t, "a@n1", "x")
			rg.relay.Start()
			testutil.WaitFor(t, wait, "dead-lettered", func() bool { return rg.store.Stats().DLQDepth == 1 })
			dl, _ := rg.store.DeadLetters(outbox.DLQFilter{})
			if dl[0].Reason != tt.reason || dl[0].Message.GetAttempts() != tt.attempts {
				t.Fatalf("reason %q attempts %d, want %q %d", dl[0].Reason, dl[0].Message.GetAttempts(), tt.reason, tt.attempts)
			}
		})
	}
}

func TestExpiredNeverDelivered(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clk := func() time.Time { return time.Unix(0, now.Load()) }
	rg := newRig(t, func(c *outbox.Config) { c.Now = clk }, nil)
	ctx := context.Background()
	for i, ttl := range []time.Duration{time.Second, time.Hour, time.Second} {
		e := &pb.Envelope{Recipient: "a@n1", Type: seq("m", 3)[i], ExpiresAtUnixMs: clk().Add(ttl).UnixMilli()}
		if err := rg.store.Enqueue(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	now.Add(int64(2 * time.Second))
	rg.relay.Start()
	testutil.WaitFor(t, wait, "live one delivered", func() bool { return rg.fake.count("a@n1") == 1 })
	if got := rg.fake.processedTypes("a@n1"); !slices.Equal(got, []string{"m001"}) {
		t.Fatalf("delivered %v", got)
	}
	dl, _ := rg.store.DeadLetters(outbox.DLQFilter{Reason: "expired"})
	if len(dl) != 2 || rg.store.Stats().Expired != 2 {
		t.Fatalf("expired dead letters %d, stats %+v", len(dl), rg.store.Stats())
	}
}

func TestLostBatchToAlivePeerCounts(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.fake.set(func(f *fake) { f.lose["n1"] = true })
	rg.send(t, "a@n1", "m0", "m1")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "attempt counted", func() bool {
		h, _ := rg.store.Head("a@n1", 1)
		return len(h) == 1 && h[0].GetAttempts() >= 1
	})
	rg.fake.set(func(f *fake) { f.lose["n1"] = false })
	testutil.WaitFor(t, wait, "delivered after recovery", func() bool { return rg.fake.count("a@n1") == 2 })
	if got := rg.fake.processedTypes("a@n1"); !slices.Equal(got, []string{"m0", "m1"}) {
		t.Fatalf("order %v", got)
	}
}

func TestCrashBetweenDeliverAndAckRedelivers(t *testing.T) {
	rg := newRig(t, nil, nil)
	gate := make(chan struct{})
	rg.fake.set(func(f *fake) { f.gate = gate })
	rg.send(t, "a@n1", "m0", "m1", "m2")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "delivery in flight", func() bool {
		rg.fake.mu.Lock()
		defer rg.fake.mu.Unlock()
		return rg.fake.calls >= 1
	})
	// "Crash": stop everything while the batch is out, before any ack.
	if err := rg.relay.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rg.store.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := outbox.DefaultConfig(rg.path)
	st, err := outbox.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Pending("a@n1") != 3 {
		t.Fatalf("pending after crash %d, want 3", st.Pending("a@n1"))
	}
	f2 := newFake()
	r2, err := partition.New(partition.DefaultConfig(), st, f2)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	r2.Start()
	testutil.WaitFor(t, wait, "redelivered", func() bool { return f2.count("a@n1") == 3 })
	if got := f2.processedTypes("a@n1"); !slices.Equal(got, []string{"m0", "m1", "m2"}) {
		t.Fatalf("redelivered %v", got)
	}
}

func TestConcurrencyBoundedPerNode(t *testing.T) {
	rg := newRig(t, func(c *outbox.Config) {
		c.Limiter = outbox.LimiterConfig{Initial: 3, Min: 1, Max: 3}
	}, func(c *partition.Config) { c.BatchSize = 2 })
	for _, r := range seq("r", 20) {
		rg.send(t, r+"@n1", "a", "b", "c")
	}
	rg.relay.Start()
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	rg.fake.mu.Lock()
	peak := rg.fake.maxConc["n1"]
	rg.fake.mu.Unlock()
	if peak > 3 || peak == 0 {
		t.Fatalf("peak in-flight messages to n1 = %d, limit 3", peak)
	}
}

package partition_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

func (rg *rig) send(tb testing.TB, recipient, typ string) partition.Sent {
	tb.Helper()
	res, err := rg.relay.Send(context.Background(), rg.msg(recipient, typ), true)
	if err != nil {
		tb.Fatalf("send %s: %v", typ, err)
	}
	return res
}

// A settled stream to a live peer gets one direct attempt: delivered
// without touching the store.
func TestSendDirectWhenSettled(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.relay.Start()
	for i, typ := range []string{"m0", "m1", "m2"} {
		if res := rg.send(t, "a@n1", typ); res.Outcome != partition.Delivered {
			t.Fatalf("send %d: %+v, want Delivered", i, res)
		}
	}
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"m0", "m1", "m2"}) {
		t.Fatalf("ran %v", got)
	}
	checkEmissions(t, rg.fake.callsSnapshot())
	if st := rg.store.Stats(); st.Enqueued != 0 || st.Fsyncs > 1 {
		t.Fatalf("store stats %+v: a delivered direct attempt touched the store", st)
	}
	if st := rg.relay.Stats(); st.Direct != 3 || st.Batches != 0 {
		t.Fatalf("relay stats %+v", st)
	}
}

// No direct attempt when the relay is not started, the caller does not
// want one, the peer is down or the stream has messages stored.
func TestSendStoresWhenNotSettled(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(t *testing.T, rg *rig)
		direct bool
	}{
		{"not started", func(*testing.T, *rig) {}, true},
		{"caller said no", func(_ *testing.T, rg *rig) { rg.relay.Start() }, false},
		{"peer down", func(_ *testing.T, rg *rig) { rg.fake.set(func(f *fake) { f.down["n1"] = true }); rg.relay.Start() }, true},
		{"messages stored", func(t *testing.T, rg *rig) {
			rg.fake.set(func(f *fake) { f.down["n1"] = true })
			rg.queue(t, "a@n1", "before")
			rg.relay.Start()
			testutil.WaitFor(t, wait, "deferred", func() bool { return rg.relay.Stats().Deferred > 0 })
			rg.fake.set(func(f *fake) { f.down["n1"] = false }) // alive, but "before" waits for DownRecheck
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, nil, func(c *partition.Config) { c.DownRecheck = time.Hour })
			tt.setup(t, rg)
			res, err := rg.relay.Send(context.Background(), rg.msg("a@n1", "x"), tt.direct)
			if err != nil || res.Outcome != partition.Queued {
				t.Fatalf("send: %+v %v, want Queued", res, err)
			}
			if st := rg.relay.Stats(); st.Direct != 0 {
				t.Fatalf("%d direct attempts", st.Direct)
			}
		})
	}
}

// A direct attempt without a final verdict (the receipt was lost after
// the handler ran) stores the message under the sequence it was sent
// with; the relay sends it again and the receiver recognises it.
func TestSendStoresUnderTheSameSequence(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.fake.set(func(f *fake) {
		f.intercept = func(ctx context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n > 0 {
				return nil, nil, false
			}
			f.mu.Lock()
			f.receive(envs[0]) // the handler runs; the receipt is lost
			f.mu.Unlock()
			return nil, errUnreachable, true
		}
	})
	rg.relay.Start()
	if res := rg.send(t, "a@n1", "m0"); res.Outcome != partition.Queued {
		t.Fatalf("send: %+v, want Queued", res)
	}
	testutil.WaitFor(t, wait, "sent again and acked", func() bool { return rg.fake.callCount() == 2 && rg.store.Pending("a@n1") == 0 })
	calls := rg.fake.callsSnapshot()
	if a, b := calls[0].envs[0], calls[1].envs[0]; a.GetSequence() != b.GetSequence() || a.GetMsgId() == b.GetMsgId() {
		t.Fatalf("direct attempt seq %d id %s, resend seq %d id %s: want the same sequence, a new msg id",
			a.GetSequence(), a.GetMsgId(), b.GetSequence(), b.GetMsgId())
	}
	if n := rg.fake.ranCount("a@n1"); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	if c := rg.fake.codes(); c[pb.Receipt_DUPLICATE] != 1 {
		t.Fatalf("receipts %v, want the resend answered DUPLICATE", c)
	}
	if st := rg.store.Stats(); st.DLQDepth != 0 || st.Retries != 0 {
		t.Fatalf("store stats %+v", st)
	}
}

// While a direct attempt is unresolved, later Sends of the stream are
// stored and nothing of the stream is emitted; afterwards they go in
// order.
func TestSendWhileDirectUnresolved(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.DirectTimeout = time.Minute })
	gate := make(chan struct{})
	rg.fake.set(func(f *fake) {
		f.intercept = func(ctx context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n == 0 {
				<-gate
			}
			return nil, nil, false
		}
	})
	rg.relay.Start()
	first := make(chan partition.Sent, 1)
	go func() { first <- rg.send(t, "a@n1", "m0") }()
	testutil.WaitFor(t, wait, "direct attempt out", func() bool { return rg.fake.callCount() == 1 })
	for _, typ := range []string{"m1", "m2"} {
		if res := rg.send(t, "a@n1", typ); res.Outcome != partition.Queued {
			t.Fatalf("send %s during a direct attempt: %+v, want Queued", typ, res)
		}
	}
	before := rg.relay.Stats().Iterations
	rg.relay.Notify("a@n1")
	testutil.WaitFor(t, wait, "the loop looked at the stream", func() bool { return rg.relay.Stats().Iterations > before })
	if n := rg.fake.callCount(); n != 1 {
		t.Fatalf("%d Deliver calls while the direct attempt was unresolved", n)
	}
	close(gate)
	if res := <-first; res.Outcome != partition.Delivered {
		t.Fatalf("first send %+v", res)
	}
	testutil.WaitFor(t, wait, "all ran", func() bool { return rg.fake.ranCount("a@n1") == 3 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"m0", "m1", "m2"}) {
		t.Fatalf("order %v", got)
	}
}

// The direct attempt's verdicts: poison and expiry dead-letter at once,
// a handler failure is stored with its attempt counted (or dead-lettered
// when MaxAttempts is 1), everything else is stored uncounted. The relay
// then sends the stored message; its wire attempt number shows what was
// counted.
func TestSendDirectVerdicts(t *testing.T) {
	tests := []struct {
		name        string
		maxAttempts int
		first       handler // the direct attempt's verdict; later attempts run
		outcome     partition.Outcome
		reason      string // dead-letter reason prefix
		attempt     uint32 // the relay's next attempt number
	}{
		{"rejected", 3, code(pb.Receipt_REJECTED, 0), partition.DeadLettered, "rejected: fake", 0},
		{"expired", 3, code(pb.Receipt_EXPIRED, 0), partition.DeadLettered, outbox.ReasonExpired, 0},
		{"transient counts", 3, code(pb.Receipt_TRANSIENT, 0), partition.Queued, "", 2},
		{"no such actor counts", 3, code(pb.Receipt_NO_SUCH_ACTOR, 0), partition.Queued, "", 2},
		{"transient at max attempts 1", 1, code(pb.Receipt_TRANSIENT, 0), partition.DeadLettered, "max attempts: fake", 0},
		{"capacity", 1, code(pb.Receipt_CAPACITY, 5), partition.Queued, "", 1},
		{"no such actor yet", 1, code(pb.Receipt_NO_SUCH_ACTOR, 5), partition.Queued, "", 1},
		{"unknown code", 1, code(pb.Receipt_Code(99), 0), partition.Queued, "", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = tt.maxAttempts }, nil)
			first := true
			rg.fake.set(func(f *fake) {
				f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
					if first {
						first = false
						return tt.first(e)
					}
					return nil
				}
			})
			rg.relay.Start()
			res := rg.send(t, "a@n1", "x")
			if res.Outcome != tt.outcome || !strings.HasPrefix(res.Reason, tt.reason) {
				t.Fatalf("send: %+v, want %v %q", res, tt.outcome, tt.reason)
			}
			if tt.outcome == partition.DeadLettered {
				dl, _ := rg.store.DeadLetters(outbox.DLQFilter{})
				if len(dl) != 1 || !strings.HasPrefix(dl[0].Reason, tt.reason) || rg.store.Pending("a@n1") != 0 {
					t.Fatalf("dead letters %+v, pending %d", dl, rg.store.Pending("a@n1"))
				}
				return
			}
			testutil.WaitFor(t, wait, "delivered by the relay", func() bool {
				return rg.store.Pending("a@n1") == 0 && rg.fake.ranCount("a@n1") == 1
			})
			calls := rg.fake.callsSnapshot()
			if got := calls[len(calls)-1].envs[0].GetAttempt(); got != tt.attempt {
				t.Fatalf("relay's attempt %d, want %d", got, tt.attempt)
			}
			if st := rg.store.Stats(); st.DLQDepth != 0 {
				t.Fatalf("dead-lettered: %+v", st)
			}
		})
	}
}

// Send after Close fails without storing anything.
func TestSendAfterClose(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.relay.Start()
	_ = rg.relay.Close()
	if _, err := rg.relay.Send(context.Background(), rg.msg("a@n1", "x"), true); !errors.Is(err, partition.ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
	if rg.store.Stats().Enqueued != 0 {
		t.Fatal("stored after Close")
	}
}

// A direct attempt's wire TTL is what the message has left, counted from
// its creation on the store's elapsed clock, also when the caller leaves
// CreatedElapsedMs to Send (zero means now, as in Enqueue).
func TestSendDirectTTL(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	rg := newRig(t, func(c *outbox.Config) { c.Clock = clk }, nil)
	rg.relay.Start()
	clk.Advance(time.Hour) // the elapsed clock is far from zero
	sm := rg.msg("a@n1", "with-created")
	sm.Envelope.TtlMs = 60_000
	clk.Advance(10 * time.Second)
	if _, err := rg.relay.Send(context.Background(), sm, true); err != nil {
		t.Fatal(err)
	}
	bare := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "b@n1", Type: "bare", TtlMs: 60_000}}
	if _, err := rg.relay.Send(context.Background(), bare, true); err != nil {
		t.Fatal(err)
	}
	calls := rg.fake.callsSnapshot()
	if len(calls) != 2 {
		t.Fatalf("%d calls", len(calls))
	}
	if got := calls[0].envs[0].GetTtlMs(); got != 50_000 {
		t.Fatalf("wire TTL %d, want the 50 s left", got)
	}
	if got := calls[1].envs[0].GetTtlMs(); got != 60_000 {
		t.Fatalf("wire TTL %d for a message created now, want 60000", got)
	}
}

// A newer OVERWRITE version delivered by a direct attempt supersedes the
// older ones as one delivered from the store does: an older version in the
// dead-letter queue is not replayed over it.
func TestDirectOverwriteSupersedesOlderVersions(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.fake.set(func(f *fake) {
		f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
			if e.GetType() == "v1" {
				return code(pb.Receipt_REJECTED, 0)(e)
			}
			return nil
		}
	})
	rg.relay.Start()
	ow := func(typ string) *pb.StoredMessage {
		sm := rg.msg("a@n1", typ)
		sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "price"
		return sm
	}
	if res, err := rg.relay.Send(context.Background(), ow("v1"), true); err != nil || res.Outcome != partition.DeadLettered {
		t.Fatalf("v1: %+v %v", res, err)
	}
	if res, err := rg.relay.Send(context.Background(), ow("v2"), true); err != nil || res.Outcome != partition.Delivered {
		t.Fatalf("v2: %+v %v", res, err)
	}
	if n, err := rg.store.Replay(outbox.DLQFilter{Recipient: "a@n1"}); n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replay of v1 after v2 was delivered directly: %d %v, want ErrSuperseded", n, err)
	}
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"v2"}) {
		t.Fatalf("ran %v", got)
	}
}

// No direct attempt while the stream has an emission out or an Ack
// committing: the message is stored behind them, and runs after them.
func TestSendStoresWhileSendingOrAcking(t *testing.T) {
	t.Run("sending", func(t *testing.T) {
		rg := newRig(t, nil, nil)
		gate := make(chan struct{})
		rg.fake.set(func(f *fake) {
			f.intercept = func(ctx context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
				<-gate
				return nil, nil, false
			}
		})
		rg.queue(t, "a@n1", "m0")
		rg.relay.Start()
		testutil.WaitFor(t, wait, "emission out", func() bool { return rg.fake.callCount() == 1 })
		res := rg.send(t, "a@n1", "m1")
		close(gate)
		if res.Outcome != partition.Queued || rg.relay.Stats().Direct != 0 {
			t.Fatalf("send during an emission: %+v, %d direct", res, rg.relay.Stats().Direct)
		}
		testutil.WaitFor(t, wait, "both ran", func() bool { return rg.fake.ranCount("a@n1") == 2 })
		if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"m0", "m1"}) {
			t.Fatalf("ran %v", got)
		}
	})
	t.Run("acking", func(t *testing.T) {
		rg := newRig(t, nil, nil)
		rg.queue(t, "a@n1", "m0")
		release := stall(t, rg.store)
		rg.relay.Start()
		testutil.WaitFor(t, wait, "m0 ran, its ack waits", func() bool { return rg.fake.ranCount("a@n1") == 1 })
		done := make(chan partition.Sent, 1)
		go func() { done <- rg.send(t, "a@n1", "m1") }() // stored: waits for the committer too
		waitQueued := func() bool { return rg.relay.Stats().Direct == 0 && rg.fake.callCount() == 1 }
		testutil.WaitFor(t, wait, "m1 handed to the store, not sent", waitQueued)
		release()
		if res := <-done; res.Outcome != partition.Queued || rg.relay.Stats().Direct != 0 {
			t.Fatalf("send while an ack commits: %+v, %d direct", res, rg.relay.Stats().Direct)
		}
		testutil.WaitFor(t, wait, "m1 ran", func() bool { return rg.fake.ranCount("a@n1") == 2 })
	})
}

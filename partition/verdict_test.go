package partition_test

import (
	"context"
	"errors"
	"fmt"
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

// refuse answers the first `times` emissions of every stream with what
// answer returns, then lets the fake receiver take over.
func refuse(times int, answer func(ctx context.Context, envs []*pb.Envelope) ([]*pb.Receipt, error)) func(context.Context, int, []*pb.Envelope) ([]*pb.Receipt, error, bool) {
	var n atomic.Int64
	return func(ctx context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
		if n.Add(1) > int64(times) {
			return nil, nil, false
		}
		rcs, err := answer(ctx, envs)
		return rcs, err, true
	}
}

func every(c pb.Receipt_Code, retryMs, watermark int64) func(context.Context, []*pb.Envelope) ([]*pb.Receipt, error) {
	return func(_ context.Context, envs []*pb.Envelope) ([]*pb.Receipt, error) {
		rcs := make([]*pb.Receipt, len(envs))
		for i, e := range envs {
			rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: c, RetryAfterMs: retryMs, Watermark: uint64(watermark)}
		}
		return rcs, nil
	}
}

// Nothing that is the network's, the sender's or the peer's load's doing
// counts toward MaxAttempts: with MaxAttempts 1, a single counted attempt
// would dead-letter a message, yet every message gets through, in order,
// after several emissions of each such outcome.
func TestUncountedOutcomesNeverDeadLetter(t *testing.T) {
	lost := func(context.Context, []*pb.Envelope) ([]*pb.Receipt, error) { return nil, errUnreachable }
	tests := []struct {
		name   string
		answer func(context.Context, []*pb.Envelope) ([]*pb.Receipt, error)
		rcfg   func(*partition.Config)
	}{
		{"capacity", every(pb.Receipt_CAPACITY, 1, 0), nil},
		{"capacity without retry_after", every(pb.Receipt_CAPACITY, 0, 0), nil},
		{"no such actor within spawn grace", every(pb.Receipt_NO_SUCH_ACTOR, 1, 0), nil},
		{"out of order", every(pb.Receipt_OUT_OF_ORDER, 0, 0), nil},
		{"accepted", every(pb.Receipt_ACCEPTED, 0, 0), nil},
		{"unknown code", every(pb.Receipt_Code(99), 0, 0), nil},
		{"unspecified code", every(pb.Receipt_CODE_UNSPECIFIED, 0, 0), nil},
		{"lost receipts", lost, nil},
		{"fewer receipts than messages", func(_ context.Context, envs []*pb.Envelope) ([]*pb.Receipt, error) { return nil, nil }, nil},
		{"local send queue full", func(context.Context, []*pb.Envelope) ([]*pb.Receipt, error) {
			return nil, fmt.Errorf("transport: queue to n1: %w", partition.ErrCongested)
		}, nil},
		{"deliver timeout", func(ctx context.Context, _ []*pb.Envelope) ([]*pb.Receipt, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, func(c *partition.Config) { c.DeliverTimeout = 20 * time.Millisecond }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 1 }, func(c *partition.Config) {
				c.BatchSize = 4
				if tt.rcfg != nil {
					tt.rcfg(c)
				}
			})
			rg.fake.set(func(f *fake) { f.intercept = refuse(3, tt.answer) })
			msgs := names("m", 10)
			rg.queue(t, "a@n1", msgs...)
			rg.relay.Start()
			testutil.WaitFor(t, wait, "all delivered", func() bool { return rg.store.Stats().Depth == 0 })
			if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, msgs) {
				t.Fatalf("ran %v", got)
			}
			if st := rg.store.Stats(); st.DLQDepth != 0 || st.Retries != 0 {
				t.Fatalf("store stats %+v: an uncounted outcome was counted", st)
			}
			for _, c := range rg.fake.callsSnapshot() {
				for _, e := range c.envs {
					if e.GetAttempt() != 1 {
						t.Fatalf("wire attempt %d: counted", e.GetAttempt())
					}
				}
			}
		})
	}
}

// The same for a peer that goes down mid-emission and comes back.
func TestPeerGoingDownNeverDeadLetters(t *testing.T) {
	rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 1 }, func(c *partition.Config) { c.DownRecheck = time.Hour })
	rg.fake.set(func(f *fake) {
		f.intercept = refuse(1, func(context.Context, []*pb.Envelope) ([]*pb.Receipt, error) {
			f.mu.Lock()
			f.down["n1"] = true
			f.mu.Unlock()
			return nil, errUnreachable
		})
	})
	msgs := names("m", 5)
	rg.queue(t, "a@n1", msgs...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "deferred while down", func() bool { return rg.relay.Stats().Deferred > 0 })
	rg.fake.set(func(f *fake) { f.down["n1"] = false })
	rg.relay.NodeAlive("n1")
	testutil.WaitFor(t, wait, "all delivered", func() bool { return rg.store.Stats().Depth == 0 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v", got)
	}
	if st := rg.store.Stats(); st.DLQDepth != 0 || st.Retries != 0 {
		t.Fatalf("store stats %+v", st)
	}
}

// Only the receiver's verdict on the message itself counts: a handler
// failure (TRANSIENT) and NO_SUCH_ACTOR past the spawn grace. At
// MaxAttempts the message goes to the DLQ and the stream moves on.
func TestCountedOutcomes(t *testing.T) {
	tests := []struct {
		name   string
		code   pb.Receipt_Code
		reason string
	}{
		{"handler failure", pb.Receipt_TRANSIENT, "max attempts: fake TRANSIENT"},
		{"no such actor", pb.Receipt_NO_SUCH_ACTOR, "max attempts: no such actor: fake NO_SUCH_ACTOR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 3 }, nil)
			rg.fake.set(func(f *fake) {
				f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
					if e.GetType() == "poison" {
						return code(tt.code, 0)(e)
					}
					return nil
				}
			})
			rg.queue(t, "a@n1", "before", "poison", "after1", "after2")
			rg.queue(t, "b@n1", names("b", 20)...)
			rg.relay.Start()
			testutil.WaitFor(t, wait, "poison dead-lettered, the rest delivered", func() bool {
				return rg.store.Stats().Depth == 0 && rg.store.Stats().DLQDepth == 1
			})
			if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"before", "after1", "after2"}) {
				t.Fatalf("ran %v", got)
			}
			if rg.fake.ranCount("b@n1") != 20 {
				t.Fatal("another stream was held up")
			}
			dl, _ := rg.store.DeadLetters(outbox.DLQFilter{})
			if dl[0].Reason != tt.reason || dl[0].Message.GetAttempts() != 3 {
				t.Fatalf("dead letter %q attempts %d, want %q and 3", dl[0].Reason, dl[0].Message.GetAttempts(), tt.reason)
			}
			var attempts []uint32
			for _, c := range rg.fake.callsSnapshot() {
				for _, e := range c.envs {
					if e.GetType() == "poison" {
						attempts = append(attempts, e.GetAttempt())
					}
				}
			}
			if !slices.Equal(attempts[:3], []uint32{1, 2, 3}) {
				t.Fatalf("poison's wire attempts %v, want 1 2 3", attempts)
			}
		})
	}
}

// REJECTED and EXPIRED settle a message at once.
func TestFinalReceipts(t *testing.T) {
	tests := []struct {
		code   pb.Receipt_Code
		reason string
	}{
		{pb.Receipt_REJECTED, "rejected: fake REJECTED"},
		{pb.Receipt_EXPIRED, outbox.ReasonExpired},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 5 }, nil)
			rg.fake.set(func(f *fake) {
				f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
					if e.GetType() == "bad" {
						return code(tt.code, 0)(e)
					}
					return nil
				}
			})
			rg.queue(t, "a@n1", "bad", "good")
			rg.relay.Start()
			testutil.WaitFor(t, wait, "settled", func() bool { return rg.store.Stats().Depth == 0 })
			dl, _ := rg.store.DeadLetters(outbox.DLQFilter{})
			if len(dl) != 1 || dl[0].Reason != tt.reason || dl[0].Message.GetAttempts() != 0 {
				t.Fatalf("dead letters %+v", dl)
			}
			if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"good"}) {
				t.Fatalf("ran %v", got)
			}
			if n := rg.fake.callCount(); n > 3 {
				t.Fatalf("%d emissions: the final receipt was retried", n)
			}
		})
	}
}

// An envelope that cannot be put on the wire is dead-lettered alone; the
// others of its emission are sent, and the stream carries on.
func TestUnsendableDeadLettersOnlyItself(t *testing.T) {
	rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 1 }, nil)
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			un := &partition.UnsendableError{Errs: map[int]error{}}
			rcs := make([]*pb.Receipt, len(envs))
			f.mu.Lock()
			defer f.mu.Unlock()
			for i, e := range envs {
				if e.GetType() == "huge" {
					un.Errs[i] = errors.New("frame too large")
					continue
				}
				rcs[i] = f.receive(e)
			}
			if len(un.Errs) == 0 {
				return rcs, nil, true
			}
			return rcs, fmt.Errorf("fake: %w", un), true
		}
	})
	rg.queue(t, "a@n1", "m0", "huge", "m2", "m3")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "settled", func() bool { return rg.store.Stats().Depth == 0 })
	dl, _ := rg.store.DeadLetters(outbox.DLQFilter{})
	if len(dl) != 1 || dl[0].Message.GetEnvelope().GetType() != "huge" || !strings.HasPrefix(dl[0].Reason, "rejected: cannot be sent: frame too large") {
		t.Fatalf("dead letters %+v", dl)
	}
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"m0", "m2", "m3"}) {
		t.Fatalf("ran %v", got)
	}
	if st := rg.store.Stats(); st.Retries != 0 {
		t.Fatalf("counted: %+v", st)
	}
}

// A DUPLICATE or OUT_OF_ORDER receipt whose watermark is above everything
// this sender ever emitted on the stream (and above the message itself)
// means the sender's state went back: a new, random epoch starts, nothing
// more of the emission is acked, and the messages run in the new epoch.
func TestRestoredSenderStartsNewEpoch(t *testing.T) {
	for _, c := range []pb.Receipt_Code{pb.Receipt_DUPLICATE, pb.Receipt_OUT_OF_ORDER} {
		t.Run(c.String(), func(t *testing.T) {
			rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
			rg.fake.set(func(f *fake) {
				f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
					if n > 0 {
						return nil, nil, false
					}
					f.mu.Lock()
					defer f.mu.Unlock()
					// m0 runs; then the receiver shows a watermark far above
					// anything sent (a backup of the sender was restored).
					rcs := []*pb.Receipt{f.receive(envs[0])}
					for _, e := range envs[1:] {
						rcs = append(rcs, &pb.Receipt{MsgId: e.GetMsgId(), Code: c, Watermark: 1 << 60})
					}
					rcs[3] = &pb.Receipt{MsgId: envs[3].GetMsgId(), Code: pb.Receipt_PROCESSED} // not acked either
					return rcs, nil, true
				}
			})
			epoch := rg.runToNewEpoch(t, names("m", 4))
			calls := rg.fake.callsSnapshot()
			last := calls[len(calls)-1]
			if last.envs[0].GetStreamEpoch() != epoch || last.envs[0].GetType() != "m001" || last.envs[0].GetPrevSequence() != 0 {
				t.Fatalf("resend %+v, want m001 first, in epoch %d", last.envs[0], epoch)
			}
		})
	}
	// Another stream restored gets a different random epoch.
	rg := newRig(t, nil, nil)
	refused := map[string]bool{} // the first emission of each stream: the two go in any order
	rg.fake.set(func(f *fake) {
		f.intercept = func(ctx context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if refused[envs[0].GetRecipient()] {
				return nil, nil, false
			}
			refused[envs[0].GetRecipient()] = true
			rcs, err := every(pb.Receipt_DUPLICATE, 0, 1<<60)(ctx, envs)
			return rcs, err, true
		}
	})
	rg.queue(t, "a@n1", "x")
	rg.queue(t, "b@n1", "y")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "delivered", func() bool { return rg.store.Stats().Depth == 0 })
	ea, _, _ := rg.store.StreamState("a@n1")
	eb, _, _ := rg.store.StreamState("b@n1")
	if ea == 0 || eb == 0 || ea == eb {
		t.Fatalf("epochs %d and %d, want two different random ones", ea, eb)
	}
}

// A FORGOTTEN receipt (the receiver forgot the stream, and the message is
// older than what it forgot) on a message that was on the wire before
// dead-letters it, as it may have run: sending it again could run it
// twice. The stream carries on with the next message.
func TestForgottenMayHaveRunDeadLetters(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 3 })
	var horizon atomic.Uint64
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if n == 0 {
				for _, e := range envs {
					f.receive(e) // all run, every receipt is lost...
					horizon.Store(max(horizon.Load(), e.GetSequence()))
				}
				return nil, errUnreachable, true
			}
			// ...and then the receiver forgets the stream.
			rcs := make([]*pb.Receipt, len(envs))
			for i, e := range envs {
				if h := horizon.Load(); e.GetSequence() <= h {
					rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_FORGOTTEN, Watermark: h}
					continue
				}
				rcs[i] = f.receive(e)
			}
			return rcs, nil, true
		}
	})
	rg.queue(t, "a@n1", "m0", "m1", "m2")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "first emission", func() bool { return rg.fake.callCount() >= 1 })
	rg.queue(t, "a@n1", "m3")
	testutil.WaitFor(t, wait, "settled", func() bool { return rg.store.Stats().Depth == 0 })
	dl, _ := rg.store.DeadLetters(outbox.DLQFilter{})
	var dead []string
	for _, d := range dl {
		if d.Reason != outbox.ReasonForgotten {
			t.Errorf("dead letter %s: reason %q, want %q", d.Message.GetEnvelope().GetType(), d.Reason, outbox.ReasonForgotten)
		}
		dead = append(dead, d.Message.GetEnvelope().GetType())
	}
	slices.Sort(dead)
	if !slices.Equal(dead, []string{"m0", "m1", "m2"}) {
		t.Fatalf("dead letters %v, want m0 m1 m2", dead)
	}
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"m0", "m1", "m2", "m3"}) {
		t.Fatalf("ran %v, want each once", got)
	}
	if st := rg.relay.Stats(); st.Restores != 0 {
		t.Fatalf("restores %d", st.Restores)
	}
}

// A FORGOTTEN receipt on a message never on the wire before cannot be
// about a run of it: the receiver's horizon is above it because this
// outbox's sequences went back (a restored backup). The stream starts a new
// epoch, which has no horizon, and the message runs there.
func TestForgottenNeverSentStartsNewEpoch(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if envs[0].GetStreamEpoch() != 0 {
				return nil, nil, false
			}
			rcs, err := every(pb.Receipt_FORGOTTEN, 0, 1<<60)(context.Background(), envs)
			return rcs, err, true
		}
	})
	rg.queue(t, "a@n1", "x", "y")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "delivered", func() bool { return rg.store.Stats().Depth == 0 })
	if dl, _ := rg.store.DeadLetters(outbox.DLQFilter{}); len(dl) != 0 {
		t.Fatalf("dead letters %+v", dl)
	}
	if e, _, _ := rg.store.StreamState("a@n1"); e == 0 {
		t.Fatal("no new epoch")
	}
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("ran %v", got)
	}
}

// A DUPLICATE whose watermark this sender may have caused (a resend after
// a lost receipt) is a positive receipt, not a restore.
func TestDuplicateWithinEmittedIsAck(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 3 })
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n > 0 {
				return nil, nil, false
			}
			f.mu.Lock()
			for _, e := range envs {
				f.receive(e) // all run, every receipt is lost
			}
			f.mu.Unlock()
			return nil, errUnreachable, true
		}
	})
	rg.queue(t, "a@n1", names("m", 5)...)
	rg.relay.Start()
	rg.noRestore(t, names("m", 5))
	if c := rg.fake.codes(); c[pb.Receipt_DUPLICATE] != 3 {
		t.Fatalf("receipts %v, want 3 duplicates", c)
	}
}

// A DUPLICATE receipt waits for the receiver's durable watermark, which may
// already cover later messages of the same emission (they ran while it
// waited). Such a watermark is above the message and above what the stream
// emitted before, but not above this emission: it is an ack, not a
// restored sender, and nothing runs again.
func TestDuplicateCoveringItsOwnEmissionIsAck(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n > 0 || len(envs) < 2 {
				return nil, nil, false
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			rcs := make([]*pb.Receipt, len(envs))
			for i, e := range envs {
				rcs[i] = f.receive(e)
			}
			top := envs[len(envs)-1].GetSequence()
			rcs[1] = &pb.Receipt{MsgId: envs[1].GetMsgId(), Code: pb.Receipt_DUPLICATE, Watermark: top}
			return rcs, nil, true
		}
	})
	rg.queue(t, "a@n1", names("m", 4)...)
	rg.relay.Start()
	rg.noRestore(t, names("m", 4))
}

// The AIMD limit halves once per congestion event (an emission answered
// CAPACITY, or refused by a full local send queue), not once per message
// of it, and grows by one per message processed.
func TestCapacityHalvesLimitOncePerEmission(t *testing.T) {
	tests := []struct {
		name   string
		answer func(context.Context, []*pb.Envelope) ([]*pb.Receipt, error)
	}{
		{"capacity", every(pb.Receipt_CAPACITY, 1, 0)},
		{"local send queue full", func(context.Context, []*pb.Envelope) ([]*pb.Receipt, error) {
			return nil, partition.ErrCongested
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, nil, func(c *partition.Config) {
				c.BatchSize = 8
				c.Limiter = partition.LimiterConfig{Initial: 64, Min: 1, Max: 64}
			})
			gate := make(chan struct{})
			rg.fake.set(func(f *fake) {
				f.intercept = func(ctx context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
					if n == 0 {
						rcs, err := tt.answer(ctx, envs)
						return rcs, err, true
					}
					<-gate // hold the second emission: the limit is read meanwhile
					return nil, nil, false
				}
			})
			rg.queue(t, "a@n1", names("m", 8)...)
			rg.relay.Start()
			testutil.WaitFor(t, wait, "second emission", func() bool { return rg.fake.callCount() == 2 })
			got := rg.relay.Stats().LimitByPeer["n1"]
			close(gate)
			if got != 32 {
				t.Fatalf("limit %d after one congested emission of 8 messages, want 64/2 = 32", got)
			}
			testutil.WaitFor(t, wait, "delivered", func() bool { return rg.store.Stats().Depth == 0 })
		})
	}
}

// A full local send queue's refusal carries the transport's estimate of
// when it has room: the stream's next emission waits that long, not a
// random backoff (here up to an hour).
func TestCongestedWaitsForTheQueuesEstimate(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	rg := newRig(t, func(c *outbox.Config) { c.Clock = clk }, func(c *partition.Config) {
		c.Backoff = partition.BackoffConfig{Base: time.Hour, Cap: time.Hour}
	})
	const hint = 7 * time.Second
	rg.fake.set(func(f *fake) {
		f.intercept = refuse(1, func(context.Context, []*pb.Envelope) ([]*pb.Receipt, error) {
			return nil, &partition.CongestedError{RetryAfter: hint, Err: errors.New("transport: send queue full")}
		})
	})
	rg.queue(t, "a@n1", "m1")
	rg.relay.Start()
	now := rg.store.ElapsedMs()
	var next int64
	testutil.WaitFor(t, wait, "the stream deferred", func() bool {
		_, next = rg.store.DueRecipients(now, nil, 10)
		return next != 0
	})
	if got := time.Duration(next-now) * time.Millisecond; got != hint {
		t.Fatalf("next emission in %v, want the queue's estimate %v", got, hint)
	}
	clk.Advance(hint)
	rg.relay.Notify("a@n1")
	testutil.WaitFor(t, wait, "delivered after the estimate", func() bool { return rg.store.Stats().Depth == 0 })
}

// A send queue that stays full and keeps estimating 1 ms: only the first
// refusal without progress trusts the estimate, later ones back off, so
// over a minute the stream is tried a few times, not every millisecond,
// and nothing is dead-lettered (a full queue is never the message's fault).
func TestCongestedHintRepeatedBacksOff(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	rg := newRig(t, func(c *outbox.Config) { c.Clock = clk; c.MaxAttempts = 1 }, func(c *partition.Config) {
		c.Backoff = partition.DefaultBackoffConfig()
	})
	rg.fake.set(func(f *fake) {
		f.intercept = func(context.Context, int, []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			return nil, &partition.CongestedError{RetryAfter: time.Millisecond, Err: errors.New("transport: send queue full")}, true
		}
	})
	rg.queue(t, "a@n1", "m1", "m2")
	rg.relay.Start()
	start := rg.store.ElapsedMs()
	const most = 30
	calls := 1
	for ; calls <= most; calls++ {
		var next int64
		testutil.WaitFor(t, wait, "the stream deferred", func() bool {
			if rg.fake.callCount() < calls {
				return false
			}
			_, next = rg.store.DueRecipients(rg.store.ElapsedMs(), nil, 10)
			return next != 0
		})
		if next-start > 60_000 {
			break
		}
		clk.Advance(time.Duration(next-rg.store.ElapsedMs()) * time.Millisecond)
		rg.relay.Notify("a@n1")
	}
	if calls > most {
		t.Fatalf("more than %d emissions within a minute of a full queue: the hint is trusted again and again", most)
	}
	if dl, _ := rg.store.DeadLetters(outbox.DLQFilter{}); len(dl) != 0 {
		t.Fatalf("dead letters: %v", dl)
	}
}

// A receiver that finds other contents under the sequence of its watermark
// answers DIVERGED: this sender's outbox went back and reused sequences
// the receiver has seen, so the emission's DUPLICATEs before it are not
// about these messages. Nothing of the emission is acked; the stream
// starts a new epoch, where every message runs.
func TestDivergedEmissionIsSentAgainInANewEpoch(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
	var w uint64 // the receiver's watermark: the first emission's second sequence, run there for another message
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if envs[0].GetStreamEpoch() != 0 {
				return nil, nil, false
			}
			if n == 0 {
				w = envs[1].GetSequence()
			}
			rcs := make([]*pb.Receipt, len(envs))
			for i, e := range envs {
				code := pb.Receipt_DIVERGED
				if e.GetSequence() < w {
					code = pb.Receipt_DUPLICATE
				}
				rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: code, Watermark: w}
			}
			return rcs, nil, true
		}
	})
	rg.runToNewEpoch(t, names("m", 4))
	if dl, _ := rg.store.DeadLetters(outbox.DLQFilter{}); len(dl) != 0 {
		t.Fatalf("dead letters %+v", dl)
	}
}

// Sequences belong to the whole outbox: a sender restored with its
// sequence record (a whole data directory from a backup) may hand the
// receiver's watermark to another recipient's message, and its stream's
// next emission then straddles the watermark without containing it. Its
// first message, under the watermark, is answered DUPLICATE as a copy, but
// it is new: the watermark lies between two of the emission's messages,
// above everything the stream sent before it, and is none of them. The
// stream starts a new epoch; nothing is acked on that DUPLICATE's word.
func TestWatermarkInsideAnEmissionButNoneOfItStartsNewEpoch(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			k := "a@n1\x000"
			if envs[0].GetRecipient() == "a@n1" && envs[0].GetStreamEpoch() == 0 {
				f.mu.Lock()
				if _, ok := f.wm[k]; !ok {
					// What ran before the restore: up to the sequence the
					// restored outbox gave b's message.
					f.wm[k] = envs[0].GetSequence() + 1
				}
				f.mu.Unlock()
			}
			return nil, nil, false
		}
	})
	rg.runAroundAnotherRecipient(t)
}

// runAroundAnotherRecipient queues a@n1's m000, b@n1's x, then a@n1's
// m001..m003 (x takes the sequence between m000's and m001's, the one the
// restored receiver's watermark names), runs the relay until all are
// delivered, and checks that a@n1's stream started one new epoch where
// its four ran once, in order.
func (rg *rig) runAroundAnotherRecipient(t *testing.T) {
	t.Helper()
	rg.queue(t, "a@n1", "m000")
	rg.queue(t, "b@n1", "x")
	rg.queue(t, "a@n1", "m001", "m002", "m003")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "delivered", func() bool { return rg.store.Stats().Depth == 0 })
	if st := rg.relay.Stats(); st.Restores != 1 {
		t.Fatalf("restores %d, want 1", st.Restores)
	}
	if got, want := rg.fake.ranTypes("a@n1"), names("m", 4); !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}

// A restored sender's first emission is refused whole (its actor not back
// yet, out of order, or the receiver full): none of it ran, so it or the
// next emission must still give the restore away. Were the refused
// sequences counted as sent, the watermark would look like one of them,
// and the new message under it would be acked as a copy, never run. A
// refusal for room says the stream's watermark, as the receiver's do.
func TestRefusedFirstEmissionStillFindsTheRestore(t *testing.T) {
	for _, code := range []pb.Receipt_Code{pb.Receipt_NO_SUCH_ACTOR, pb.Receipt_OUT_OF_ORDER, pb.Receipt_CAPACITY} {
		t.Run(code.String(), func(t *testing.T) {
			rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
			refused := false
			rg.fake.set(func(f *fake) {
				f.intercept = func(_ context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
					if envs[0].GetRecipient() != "a@n1" || envs[0].GetStreamEpoch() != 0 {
						return nil, nil, false
					}
					f.mu.Lock()
					defer f.mu.Unlock()
					k := "a@n1\x000"
					if f.wm[k] == 0 {
						// What ran before the restore: up to the sequence the
						// restored outbox gave b's message.
						f.wm[k] = envs[0].GetSequence() + 1
					}
					if refused {
						return nil, nil, false
					}
					refused = true
					rcs := make([]*pb.Receipt, len(envs))
					for i, e := range envs {
						rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: code, RetryAfterMs: 1}
						if code == pb.Receipt_CAPACITY {
							rcs[i].Watermark = f.wm[k]
						}
					}
					return rcs, nil, true
				}
			})
			rg.runAroundAnotherRecipient(t)
		})
	}
}

// A message whose handler ran but whose reply or watermark the receiver's
// disk refused is answered CAPACITY: it was on the wire and it ran, so
// CAPACITY must not count as "did not run". When the receiver then
// answers its next copy FORGOTTEN (it forgot the stream, the message is
// older than what it forgot), the message may have run and must be
// dead-lettered as forgotten, not sent again in a new epoch, where it
// runs a second time.
func TestForgottenAfterARunAnsweredCapacityDeadLetters(t *testing.T) {
	rg := newRig(t, nil, nil)
	var n atomic.Int64
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if envs[0].GetStreamEpoch() != 0 {
				return nil, nil, false // a new epoch: the receiver runs it (again)
			}
			rcs := make([]*pb.Receipt, len(envs))
			switch n.Add(1) {
			case 1:
				// The handler runs; storing its reply fails: CAPACITY, the
				// watermark stays.
				f.mu.Lock()
				f.ran["a@n1"] = append(f.ran["a@n1"], envs[0])
				f.mu.Unlock()
				rcs[0] = &pb.Receipt{MsgId: envs[0].GetMsgId(), Code: pb.Receipt_CAPACITY, RetryAfterMs: 1,
					Message: "reply not stored: outbox: no space left on device"}
			default:
				// The receiver forgot the stream meanwhile.
				rcs[0] = &pb.Receipt{MsgId: envs[0].GetMsgId(), Code: pb.Receipt_FORGOTTEN, Watermark: envs[0].GetSequence()}
			}
			return rcs, nil, true
		}
	})
	rg.queue(t, "a@n1", "req")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "settled", func() bool { return rg.store.Stats().Depth == 0 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"req"}) {
		t.Fatalf("the request's handler ran %d times (%v), want once; restores %d", len(got), got, rg.relay.Stats().Restores)
	}
	dl, _ := rg.store.DeadLetters(outbox.DLQFilter{})
	if len(dl) != 1 || dl[0].Reason != outbox.ReasonForgotten {
		t.Fatalf("dead letters %v, want the request as %q", dl, outbox.ReasonForgotten)
	}
}

// A receiver full for a moment refuses a message of a stream that is not
// restored: its refusal carries the stream's watermark, one this sender
// set, so the stream goes on in its epoch and every message runs once, in
// order.
func TestRoomRefusalWithItsOwnWatermarkIsNoRestore(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
	refused := false
	rg.fake.set(func(f *fake) {
		f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
			if e.GetType() != "m002" || refused {
				return nil
			}
			refused = true
			return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_CAPACITY, RetryAfterMs: 1, Watermark: f.wm["a@n1\x000"]}
		}
	})
	rg.queue(t, "a@n1", names("m", 4)...)
	rg.relay.Start()
	rg.noRestore(t, names("m", 4))
	if !refused {
		t.Fatal("m002 was never refused: the case did not happen")
	}
}

// The same watermark between two messages of an emission, when the stream
// sent it before (its receipt came back, the one of an earlier message was
// lost), is the receiver's word on messages this sender did send: an ack,
// in the same run and after a restart of the relay (whose high-water then
// comes from the store), and nothing runs twice.
func TestWatermarkInsideAnEmissionSentBeforeIsAck(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			var rcfg partition.Config
			rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 3; rcfg = *c })
			rg.runFirstEmission(func(i int, e *pb.Envelope, rc *pb.Receipt) *pb.Receipt {
				switch {
				case i > 0:
					return rc
				case restart:
					return heldBack(e) // m000 ran; its receipt holds it back until the restart
				}
				return nil // m000 ran; its receipt is lost
			})
			rg.queue(t, "a@n1", names("m", 4)...)
			rg.relay.Start()
			if restart {
				testutil.WaitFor(t, wait, "m001, m002 acked", func() bool { return rg.store.Stats().Depth == 2 })
				rg.restartRelay(t, rcfg)
			}
			rg.relay.NodeAlive("n1") // m000's deferral ends now
			rg.noRestore(t, names("m", 4))
		})
	}
}

// A message that ran (its receipt lost) is replaced by a newer OVERWRITE
// version: the stream's next emission straddles the receiver's watermark,
// the old version's sequence, which the stream did send. No restore, in the
// same run and after a restart of the relay (its high-water then comes from
// the store); nothing runs twice.
func TestWatermarkOfAMessageReplacedAfterItRanIsNoRestore(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			var rcfg partition.Config
			rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 3; rcfg = *c })
			rg.runFirstEmission(func(_ int, e *pb.Envelope, _ *pb.Receipt) *pb.Receipt {
				return heldBack(e) // ran; its receipt lost
			})
			k := func(typ string) *pb.StoredMessage {
				sm := rg.msg("a@n1", typ)
				sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "state"
				return sm
			}
			rg.storeAll(t, rg.msg("a@n1", "m0"), rg.msg("a@n1", "m1"), k("k2"))
			rg.relay.Start()
			testutil.WaitFor(t, wait, "first emission", func() bool { return rg.fake.callCount() >= 1 })
			rg.storeAll(t, k("k3")) // replaces k2, which ran
			if restart {
				rg.restartRelay(t, rcfg)
			}
			rg.relay.NodeAlive("n1") // the first emission's deferral ends now
			rg.noRestore(t, []string{"m0", "m1", "k2", "k3"})
		})
	}
}

// A stream whose queue emptied keeps no high-water on disk: after a restart
// of the relay it knows of nothing it sent, and the receiver's watermark
// (the last message that ran) is above that. Its new messages are above
// every sequence handed out before, so a watermark below the emission's
// first message is the receiver's old word, not a restore: when the first
// message fails, the next is answered OUT_OF_ORDER with that watermark,
// and the stream carries on in its epoch.
func TestOldWatermarkBelowAnEmissionIsNoRestore(t *testing.T) {
	var rcfg partition.Config
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4; rcfg = *c })
	var failed atomic.Bool
	rg.fake.set(func(f *fake) {
		f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
			if e.GetType() == "n000" && failed.CompareAndSwap(false, true) {
				return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_TRANSIENT, Message: "once"}
			}
			return nil
		}
	})
	rg.queue(t, "a@n1", "m000")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "m000 delivered", func() bool { return rg.store.Stats().Depth == 0 })
	rg.restartRelay(t, rcfg)
	rg.queue(t, "a@n1", names("n", 2)...)
	rg.noRestore(t, []string{"m000", "n000", "n001"})
	if !failed.Load() {
		t.Fatal("n000 never failed: the case did not happen")
	}
}

// runFirstEmission makes the fake receiver run every message of the
// relay's first emission and answer each with answer(its index, it, the
// receipt the receiver made).
func (rg *rig) runFirstEmission(answer func(i int, e *pb.Envelope, rc *pb.Receipt) *pb.Receipt) {
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n > 0 {
				return nil, nil, false
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			rcs := make([]*pb.Receipt, len(envs))
			for i, e := range envs {
				rcs[i] = answer(i, e, f.receive(e))
			}
			return rcs, nil, true
		}
	})
}

// heldBack is a receipt that defers e's stream for a minute (uncounted):
// the test ends the wait with NodeAlive.
func heldBack(e *pb.Envelope) *pb.Receipt {
	return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_CAPACITY, RetryAfterMs: 60_000}
}

// restartRelay closes rg's relay and starts another on the same store, as
// a node's restart does: its streams come back from the store.
func (rg *rig) restartRelay(t *testing.T, cfg partition.Config) {
	t.Helper()
	if err := rg.relay.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := partition.New(cfg, rg.store, rg.fake)
	if err != nil {
		t.Fatal(err)
	}
	rg.relay = r
	rg.relay.Start()
}

// noRestore waits until nothing is queued and checks that a@n1's stream
// stayed in its epoch, where want ran, each once, in order.
func (rg *rig) noRestore(t *testing.T, want []string) {
	t.Helper()
	testutil.WaitFor(t, wait, "delivered", func() bool { return rg.store.Stats().Depth == 0 })
	if st := rg.relay.Stats(); st.Restores != 0 {
		t.Fatalf("restores %d, want 0", st.Restores)
	}
	if e, _, _ := rg.store.StreamState("a@n1"); e != 0 {
		t.Fatalf("epoch changed to %d", e)
	}
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}

// runToNewEpoch queues msgs for a@n1, starts the relay and waits until all
// are delivered; the stream must have started one new epoch, where each
// message ran once, in order. It returns the new epoch.
func (rg *rig) runToNewEpoch(t *testing.T, msgs []string) uint64 {
	t.Helper()
	rg.queue(t, "a@n1", msgs...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "delivered", func() bool { return rg.store.Stats().Depth == 0 })
	if st := rg.relay.Stats(); st.Restores != 1 {
		t.Fatalf("restores %d, want 1", st.Restores)
	}
	epoch, _, err := rg.store.StreamState("a@n1")
	if err != nil || epoch == 0 {
		t.Fatalf("epoch %d (%v), want a new one", epoch, err)
	}
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v, want %v", got, msgs)
	}
	return epoch
}

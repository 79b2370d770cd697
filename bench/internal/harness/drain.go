package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// drainSizeNote ends a drain row's note when the backlog is smaller than
// the target's.
const drainSizeNote = "; the target is for a 1M backlog: run -backlog 1000000"

// fillChunk is how many messages one Dispatch call stores (one commit).
const fillChunk = 1024

// fillBacklog stores count reliable messages in n's outbox, round-robin
// over tos (fillChunk must be a multiple of len(tos) for an even spread).
// It uses Dispatch with the targets repeated, which builds the same envelopes as
// TellReliable (own msg id, sequence and key each) but commits a chunk at
// once, so filling a 1M backlog takes seconds, not minutes.
func fillBacklog(n *node.Node, tos []node.Address, count, payload int) error {
	msg := wrapperspb.Bytes(make([]byte, payload))
	targets := make([]node.Address, fillChunk)
	for i := range targets {
		targets[i] = tos[i%len(tos)]
	}
	ctx := context.Background()
	for left := count; left > 0; left -= fillChunk {
		k := min(left, fillChunk)
		res, err := n.Dispatch(ctx, targets[:k], msg)
		if err != nil {
			return fmt.Errorf("bench: fill backlog: %w", err)
		}
		if res.Rejected > 0 {
			for _, e := range res.Errors {
				return fmt.Errorf("bench: fill backlog: %d rejected: %w", res.Rejected, e)
			}
		}
	}
	return nil
}

func mkdirFor(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("bench: create directory: %w", err)
	}
	return nil
}

// drainPhase measures the drain of a backlog into an in-process actor and
// into a daemon inbox (the daemon's inbox actor on its own inbox.db), the
// two places a returning peer's backlog lands.
func (e *env) drainPhase() ([]Row, error) {
	actor, err := e.drainInto("drain", "drain backlog to returning peer (in-process actor)", 1, spawnCounter)
	if err != nil {
		return nil, err
	}
	box, err := e.drainInto("drain-inbox", "drain backlog to returning peer (daemon inbox)", 1,
		func(rcv *node.Node, _ string, s *sink, first *int64) (func(), error) {
			path := filepath.Join(e.dir, "drain-inbox", "inbox.db")
			if err := mkdirFor(path); err != nil {
				return nil, err
			}
			cfg := inbox.DefaultConfig(path)
			cfg.MaxMessages = max(cfg.MaxMessages, e.cfg.Backlog)
			st, err := inbox.Open(cfg)
			if err != nil {
				return nil, fmt.Errorf("bench: drain: open inbox: %w", err)
			}
			closeStore := func() { _ = st.Close() }
			if _, err := st.Declare("w"); err != nil {
				return closeStore, fmt.Errorf("bench: drain: declare inbox: %w", err)
			}
			// The daemon's own handlers and options (inbox.SpawnOptions);
			// the sink counts what the inbox stored, after the commit.
			batch := inbox.BatchHandler(st, "w")
			_, err = rcv.Spawn("w", inbox.Handler(st, "w"), node.WithBatch(func(ctx context.Context, msgs []*node.Message) (int, error) {
				done, err := batch(ctx, msgs)
				if done > 0 && atomic.LoadInt64(first) == 0 {
					atomic.CompareAndSwapInt64(first, 0, time.Now().UnixNano())
				}
				s.add(int64(done))
				return done, err
			}, inbox.ActorBatch), node.WithApplied(inbox.Applied(st)))
			return closeStore, err
		})
	if err != nil {
		return nil, err
	}
	return append(actor, box...), nil
}

// spawnCounter puts an actor named name on rcv that counts into s: the
// in-process recipient of a drain.
func spawnCounter(rcv *node.Node, name string, s *sink, first *int64) (func(), error) {
	_, err := rcv.Spawn(name, func(ctx context.Context, m *node.Message) (proto.Message, error) {
		if atomic.LoadInt64(first) == 0 {
			atomic.CompareAndSwapInt64(first, 0, time.Now().UnixNano())
		}
		s.hit()
		return nil, nil
	}, node.WithMailbox(mailbox.DefaultCapacity, mailbox.Reject))
	return nil, err
}

// drainInto queues cfg.Backlog messages, round-robin over streams actors
// w (one stream) or w0, w1, ... of sink, a node that is not running, then
// starts it, lets spawn put each actor there and times until the actors
// have processed all.
func (e *env) drainInto(sub, phase string, streams int, spawn func(rcv *node.Node, name string, s *sink, first *int64) (cleanup func(), err error)) ([]Row, error) {
	sender, err := e.startNode("n1", sub)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sender.Close() }()
	names := []string{"w"}
	if streams > 1 {
		names = make([]string, streams)
		for i := range names {
			names[i] = fmt.Sprintf("w%d", i)
		}
	}
	tos := make([]node.Address, len(names))
	for i, name := range names {
		tos[i] = node.Addr(name, "sink")
	}
	t0 := time.Now()
	if err := fillBacklog(sender, tos, e.cfg.Backlog, e.cfg.Payload); err != nil {
		return nil, err
	}
	if d := sender.Outbox().Stats().Depth; d != e.cfg.Backlog {
		return nil, fmt.Errorf("bench: drain: outbox depth %d after filling, want %d", d, e.cfg.Backlog)
	}
	e.cfg.logf("%s: %d queued in %v", sub, e.cfg.Backlog, time.Since(t0).Round(time.Millisecond))

	var s sink
	var firstNanos int64
	stop, err := e.profile(sub)
	if err != nil {
		return nil, err
	}
	defer stop()
	start := time.Now()
	sinkCfg, err := e.nodeConfig("sink", sub, sender.GossipAddr())
	if err != nil {
		return nil, err
	}
	rcv, err := node.Open(sinkCfg)
	if err != nil {
		return nil, fmt.Errorf("bench: drain: open sink: %w", err)
	}
	var cleanups []func() // what spawn opened, closed after the node
	defer func() {
		_ = rcv.Close()
		for _, c := range cleanups {
			if c != nil {
				c()
			}
		}
	}()
	// As the daemon does: the actors (and the inbox's store) are in place
	// before the node joins, so the first emission finds them (a miss
	// would show as NoSuchActor in the note, and cost the sender a
	// backoff).
	for _, name := range names {
		c, err := spawn(rcv, name, &s, &firstNanos)
		cleanups = append(cleanups, c)
		if err != nil {
			return nil, fmt.Errorf("bench: drain: spawn: %w", err)
		}
	}
	if err := rcv.Start(context.Background()); err != nil {
		return nil, fmt.Errorf("bench: drain: start sink: %w", err)
	}
	if err := waitFor(e.cfg.Timeout, "backlog drained", func() bool {
		return s.n.Load() >= int64(e.cfg.Backlog)
	}); err != nil {
		st := sender.Outbox().Stats()
		return nil, fmt.Errorf("bench: drain: processed %d of %d (outbox depth %d, DLQ %d): %w",
			s.n.Load(), e.cfg.Backlog, st.Depth, st.DLQDepth, err)
	}
	stop()
	firstNanos = atomic.LoadInt64(&firstNanos)
	total := time.Duration(s.last.Load() - start.UnixNano())
	pure := time.Duration(s.last.Load() - firstNanos)
	rate := float64(e.cfg.Backlog) / total.Seconds()
	e.cfg.logf("%s: %d processed in %v (%.0f msgs/s)", sub, e.cfg.Backlog, total.Round(time.Millisecond), rate)
	rst, ost := rcv.Stats(), sender.Outbox().Stats()
	wire := float64(sender.PeerStats()["sink"].BytesOut) / float64(e.cfg.Backlog)
	note := fmt.Sprintf("%d msgs in %v from sink start (first after %v; %.0f msgs/s from then; %.0f B a message on the wire); %d retries, %d refused full, %d no-such-actor",
		e.cfg.Backlog, total.Round(time.Millisecond), time.Duration(firstNanos-start.UnixNano()).Round(time.Millisecond),
		ratio(float64(e.cfg.Backlog-1), pure.Seconds()), wire, ost.Retries, rst.RefusedFull, rst.NoSuchActor)
	if e.cfg.Backlog < 1_000_000 {
		note += drainSizeNote
	}
	return []Row{{Phase: phase, Meshnode: Figure{Value: rate, Unit: "msgs/s"},
		Target: "≥ 100000 msgs/s", Met: yesNo(rate >= 100_000), Note: note}}, nil
}

package testnet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// keyset counts handler runs per key, to tell effects from duplicates.
type keyset struct {
	mu   sync.Mutex // mu guards the field below
	runs map[uint64]int
}

func (k *keyset) add(v uint64) {
	k.mu.Lock()
	if k.runs == nil {
		k.runs = map[uint64]int{}
	}
	k.runs[v]++
	k.mu.Unlock()
}

func (k *keyset) stats() (distinct, dups int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, n := range k.runs {
		distinct++
		dups += n - 1
	}
	return distinct, dups
}

// work simulates d of processing inside a handler (the scenario's load,
// not synchronisation).
func work(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// counting returns a handler that records the UInt64 body in ks and
// simulates d of work.
func (s *stage) counting(ks *keyset, d func() time.Duration) node.Handler {
	return func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.UInt64Value
		if err := m.Decode(&v); err != nil {
			return nil, err
		}
		if d != nil {
			work(ctx, d())
		}
		ks.add(v.GetValue())
		s.processed.Add(1)
		return nil, nil
	}
}

func (s *stage) waitAll(ctx context.Context, timeout time.Duration, ks *keyset, want int) error {
	deadline := time.Now().Add(timeout)
	for {
		if d, _ := ks.stats(); d >= want {
			return nil
		}
		if time.Now().After(deadline) {
			d, _ := ks.stats()
			return fmt.Errorf("%w: %d of %d processed after %v", ErrNotDrained, d, want, timeout)
		}
		t := time.NewTimer(20 * time.Millisecond) // polling interval
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func others(n int) []int {
	out := make([]int, 0, n-1)
	for i := 1; i < n; i++ {
		out = append(out, i)
	}
	return out
}

func refusedFull(c *Cluster, idx ...int) int64 {
	var sum int64
	for _, i := range idx {
		if nd := c.Node(i); nd != nil {
			sum += int64(nd.Stats().RefusedFull)
		}
	}
	return sum
}

// drainTimeout bounds the wait for a scenario's messages. The slow
// receivers the scenarios are built around (a leader with a 16-slot
// mailbox, a collector of 2 that is busy half the time) take a few
// milliseconds per message at 100k messages, so the bound is generous.
func drainTimeout(size Size) time.Duration {
	return 60*time.Second + time.Duration(size.Messages)*4*time.Millisecond
}

// thunderingHerd: every worker queues its requests while the leader is
// cut off; at heal they all hit the leader's small mailbox at once, and
// the workers' AIMD limits for the leader fall and recover.
func thunderingHerd(ctx context.Context, s *stage) error {
	var ks keyset
	if err := s.setSpawn(func(i int, n *node.Node) error {
		if i != 0 {
			return nil
		}
		_, err := n.Spawn("leader", s.counting(&ks, func() time.Duration { return 300 * time.Microsecond }), node.WithMailbox(16, mailbox.Reject))
		return err
	}); err != nil {
		return err
	}
	senders := others(s.size.Nodes)
	s.setObserve(senders...)
	s.c.Isolate(0)
	s.mark("leader cut off")
	if err := s.c.WaitDown(0, 15*time.Second); err != nil {
		return err
	}
	leader := s.c.Addr("leader", 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	// Each sending node runs a few goroutines for its workers' requests.
	const perNode = 16
	for _, i := range senders {
		for g := range perNode {
			wg.Go(func() {
				nd := s.c.Node(i)
				for m := g*len(senders) + (i - 1); m < s.size.Messages; m += perNode * len(senders) {
					if _, err := nd.TellReliable(ctx, leader, wrapperspb.UInt64(uint64(m)), node.WithIdempotencyKey(fmt.Sprintf("req-%d", m))); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.res.Sent = s.size.Messages
	s.count("queued while leader cut", int64(s.sampleDepth()))
	s.c.Heal()
	s.mark("healed")
	if err := s.waitAll(ctx, drainTimeout(s.size), &ks, s.size.Messages); err != nil {
		return err
	}
	if err := s.c.WaitDrained(drainTimeout(s.size)); err != nil {
		return err
	}
	d, dups := ks.stats()
	s.count("leader refusals (mailbox full)", refusedFull(s.c, 0))
	s.count("duplicate effects", int64(dups))
	s.check("every request processed", d == s.size.Messages)
	s.check("no duplicate effects (keys dedupe)", dups == 0)
	return nil
}

func (s *stage) sampleDepth() int {
	total := 0
	for _, i := range s.observed() {
		if nd := s.c.Node(i); nd != nil {
			total += nd.Outbox().Stats().Depth
		}
	}
	return total
}

// waveDeployment: the leader (n0) updates the fleet in waves: each wave
// dispatches one download per worker to the config servers (mailbox
// capacity 2, one download at a time), waiting for a wave to drain before
// the next.
func waveDeployment(ctx context.Context, s *stage) error {
	var ks keyset
	if err := s.setSpawn(func(i int, n *node.Node) error {
		if i == 0 {
			return nil
		}
		_, err := n.Spawn("config", s.counting(&ks, func() time.Duration { return time.Millisecond }), node.WithMailbox(2, mailbox.Reject))
		return err
	}); err != nil {
		return err
	}
	s.setObserve(0)
	leader := s.c.Node(0)
	waveSize := s.size.Workers // one download per worker per wave
	m := 0
	waves := 0
	for m < s.size.Messages {
		var targets []node.Address
		for k := 0; k < waveSize && m+k < s.size.Messages; k++ {
			w := (m + k) % s.size.Workers
			targets = append(targets, s.c.Addr("config", 1+w%(s.size.Nodes-1)))
		}
		// One Dispatch per target so every download carries its own body;
		// concurrent, so the outbox group-commits a wave in few fsyncs.
		var wg sync.WaitGroup
		errs := make([]error, len(targets))
		sem := make(chan struct{}, 32)
		for k, t := range targets {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				res, err := leader.Dispatch(ctx, []node.Address{t}, wrapperspb.UInt64(uint64(m+k)))
				errs[k] = err
				s.count("accepted", int64(res.Accepted))
				s.count("rejected", int64(res.Rejected))
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		m += len(targets)
		waves++
		if err := s.waitAll(ctx, drainTimeout(s.size), &ks, m); err != nil {
			return err
		}
	}
	s.res.Sent = m
	if err := s.c.WaitDrained(drainTimeout(s.size)); err != nil {
		return err
	}
	d, dups := ks.stats()
	s.count("waves", int64(waves))
	s.count("config server refusals (mailbox full)", refusedFull(s.c, others(s.size.Nodes)...))
	s.check("every download processed", d == s.size.Messages && dups == 0)
	return nil
}

// heartbeatCoalescing: n1 sends heartbeats for every worker as fast as it
// can, with one OVERWRITE key per worker, to a slow leader on n0; waiting
// heartbeats are replaced, and the newest of each worker arrives.
func heartbeatCoalescing(ctx context.Context, s *stage) error {
	var mu sync.Mutex // mu guards the field below
	latest := map[uint64]uint64{}
	if err := s.setSpawn(func(i int, n *node.Node) error {
		if i != 0 {
			return nil
		}
		_, err := n.Spawn("leader", func(ctx context.Context, m *node.Message) (proto.Message, error) {
			var v wrapperspb.UInt64Value
			if err := m.Decode(&v); err != nil {
				return nil, err
			}
			work(ctx, 5*time.Millisecond)
			w := v.GetValue() % uint64(s.size.Workers)
			mu.Lock()
			latest[w] = max(latest[w], v.GetValue())
			mu.Unlock()
			s.processed.Add(1)
			return nil, nil
		}, node.WithMailbox(1, mailbox.Reject))
		return err
	}); err != nil {
		return err
	}
	s.setObserve(1)
	sender := s.c.Node(1)
	leader := s.c.Addr("leader", 0)
	for m := range s.size.Messages {
		w := m % s.size.Workers
		if _, err := sender.Dispatch(ctx, []node.Address{leader}, wrapperspb.UInt64(uint64(m)), node.WithOverwrite(fmt.Sprintf("hb-w%d", w))); err != nil {
			return err
		}
	}
	s.res.Sent = s.size.Messages
	if err := s.c.WaitDrained(drainTimeout(s.size)); err != nil {
		return err
	}
	st := sender.Outbox().Stats()
	s.count("coalesced (replaced while waiting)", int64(st.Coalesced))
	s.count("superseded (older dropped)", int64(st.Superseded))
	newest := true
	mu.Lock()
	for w := range s.size.Workers {
		last := uint64(s.size.Messages - 1 - (s.size.Messages-1-w)%s.size.Workers)
		if w < s.size.Messages && latest[uint64(w)] != last {
			newest = false
		}
	}
	mu.Unlock()
	s.check("newest heartbeat of every worker processed", newest)
	s.check("fewer handler runs than heartbeats", s.processed.Load() < int64(s.size.Messages))
	return nil
}

// telemetryFallback: workers on n1.. ask the collector (n0) first and fall
// back to the outbox on any failure; the collector is slow half of the
// time. Every reading is processed; both paths are counted.
func telemetryFallback(ctx context.Context, s *stage) error {
	var ks keyset
	start := time.Now()
	if err := s.setSpawn(func(i int, n *node.Node) error {
		if i != 0 {
			return nil
		}
		_, err := n.Spawn("collector", s.counting(&ks, func() time.Duration {
			if (time.Since(start)/(250*time.Millisecond))%2 == 1 {
				return 20 * time.Millisecond // busy phase
			}
			return 0
		}), node.WithMailbox(2, mailbox.Reject))
		return err
	}); err != nil {
		return err
	}
	senders := others(s.size.Nodes)
	s.setObserve(senders...)
	collector := s.c.Addr("collector", 0)
	const perNode = 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	stride := perNode * len(senders)
	for k, i := range senders {
		for g := range perNode {
			wg.Go(func() {
				nd := s.c.Node(i)
				for m := k*perNode + g; m < s.size.Messages; m += stride {
					body := wrapperspb.UInt64(uint64(m))
					actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
					err := nd.Ask(actx, collector, body, nil)
					cancel()
					if err == nil {
						s.count("fast path (ask ok)", 1)
						continue
					}
					if _, err := nd.Dispatch(ctx, []node.Address{collector}, body, node.WithIdempotencyKey(fmt.Sprintf("t%d", m))); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
					s.count("fallback (outbox)", 1)
				}
			})
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.res.Sent = s.size.Messages
	if err := s.waitAll(ctx, drainTimeout(s.size), &ks, s.size.Messages); err != nil {
		return err
	}
	if err := s.c.WaitDrained(drainTimeout(s.size)); err != nil {
		return err
	}
	d, dups := ks.stats()
	s.count("re-runs (ask timed out after running, then fallback)", int64(dups))
	s.check("every reading processed", d == s.size.Messages)
	s.mu.Lock()
	fast, fb := s.res.Counts["fast path (ask ok)"], s.res.Counts["fallback (outbox)"]
	s.mu.Unlock()
	s.check("both paths used", fast > 0 && fb > 0)
	return nil
}

// offlineDelivery: n0 deploys to workers spread over n1..; a third of the
// way in, half the worker nodes are killed; two thirds in, the sender
// itself stops and restarts on its data directory; then the workers come
// back. The invariant checker must find every message delivered once, in
// order.
func offlineDelivery(ctx context.Context, s *stage) error {
	rec := NewRecorder(1)
	if err := s.setSpawn(func(i int, n *node.Node) error {
		if i == 0 {
			return nil
		}
		for w := range s.size.Workers {
			if 1+w%(s.size.Nodes-1) != i {
				continue
			}
			h := RecordingHandler(rec, n, NoBug)
			if _, err := n.Spawn(fmt.Sprintf("w%d", w), func(ctx context.Context, m *node.Message) (proto.Message, error) {
				r, err := h(ctx, m)
				if err == nil {
					s.processed.Add(1)
				}
				return r, err
			}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	s.setObserve(0)
	per := max(1, s.size.Messages/s.size.Workers)
	phase := func(from, to int) error {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		sender := s.c.Node(0)
		for w := range s.size.Workers {
			wg.Go(func() {
				addr := s.c.Addr(fmt.Sprintf("w%d", w), 1+w%(s.size.Nodes-1))
				for range to - from {
					if _, err := SendReliable(ctx, rec, sender, addr); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	third := max(1, per/3)
	if err := phase(0, third); err != nil {
		return err
	}
	down := others(s.size.Nodes)[:max(1, (s.size.Nodes-1)/2)]
	for _, i := range down {
		if err := s.c.Kill(i); err != nil {
			return err
		}
	}
	s.mark(fmt.Sprintf("worker nodes killed: %d", len(down)))
	if err := phase(third, 2*third); err != nil {
		return err
	}
	if err := s.c.Stop(0); err != nil {
		return err
	}
	s.mark("sender stopped")
	if err := s.c.Restart(0); err != nil {
		return err
	}
	s.mark("sender restarted")
	if err := s.c.WaitConverged(20 * time.Second); err != nil {
		return err
	}
	if err := phase(2*third, per); err != nil {
		return err
	}
	s.count("worker nodes killed", int64(len(down)))
	for _, i := range down {
		if err := s.c.Restart(i); err != nil {
			return err
		}
	}
	s.mark("worker nodes restarted")
	if err := s.c.WaitConverged(20 * time.Second); err != nil {
		return err
	}
	if err := s.c.WaitDrained(drainTimeout(s.size)); err != nil {
		return err
	}
	rep, err := s.c.Check(rec)
	if err != nil {
		return err
	}
	s.res.Report = &rep
	s.res.Sent = rep.Sent
	s.count("delivered directly", int64(rep.Delivered))
	s.count("queued", int64(rep.Queued))
	s.check("nothing lost, no duplicates, in order", rep.OK())
	return nil
}

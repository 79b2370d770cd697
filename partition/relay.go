package partition

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Deliverer is what the relay needs from the network. The relay is tested
// with a fake.
type Deliverer interface {
	// Alive reports the membership view of node; it must be fast and must
	// not block.
	Alive(node string) bool
	// Deliver sends msgs (all for one recipient, in FIFO order; the relay
	// sets Attempt and chains them: msgs[i].PrevSequence =
	// msgs[i-1].Sequence, msgs[0].PrevSequence = 0) and returns one receipt
	// per message in order; a nil receipt (with err) means it did not come
	// back. It must return when ctx ends.
	Deliver(ctx context.Context, node string, msgs []*pb.Envelope) ([]*pb.Receipt, error)
}

// PartitionOf maps a recipient to a partition in [0, partitions) by FNV-1a
// 32. partitions < 1 is treated as 1.
func PartitionOf(recipient string, partitions int) int {
	if partitions <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(recipient))
	return int(h.Sum32() % uint32(partitions))
}

// Stats counts what the relay did.
type Stats struct {
	Iterations uint64 // loop iterations, all partitions (an idle relay does none)
	Batches    uint64 // Deliver calls
	Delivered  uint64 // messages acked after a positive receipt
	Failed     uint64 // negative receipts and lost batches
	Deferred   uint64 // recipients deferred because their peer was down
}

// Relay drains the outbox through a Deliverer, one loop per partition.
type Relay struct {
	cfg   Config
	store *outbox.Store
	d     Deliverer
	parts []*part

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // loops and delivery goroutines

	startOnce, closeOnce sync.Once
	started              atomic.Bool

	iterations, batches, delivered, failed, deferred atomic.Uint64
}

// part is one partition.
type part struct {
	id   int
	wake chan struct{} // cap 1: a pending wake-up

	// mu guards the fields below.
	mu    sync.Mutex
	rcpts map[string]*rstate // recipients with a batch in flight or acks pending
}

// rstate is the relay's view of one recipient between Head and the commit
// of its Ack. Guarded by its part's mu.
type rstate struct {
	// sending: a batch was taken from the store and its receipts are not
	// processed yet (FIFO: at most one). Cleared early, before the Ack
	// commits, only when every receipt was positive.
	sending bool
	// acking lists the sequences of batches whose positive receipts came
	// back but whose Ack has not committed (pipelining): HeadSkip passes
	// over them, so the next batch does not resend them. Kept sorted.
	acking []uint64
	// ackBatches counts the Acks behind acking (bounded by
	// Config.MaxAckPending).
	ackBatches int
}

func (st *rstate) idle() bool { return !st.sending && st.ackBatches == 0 }

// busy reports whether rcpt cannot start a batch now. Caller holds p.mu.
func (p *part) busy(rcpt string, maxAck int) bool {
	st := p.rcpts[rcpt]
	return st != nil && (st.sending || st.ackBatches >= maxAck)
}

// New builds a relay over store and d and hooks store.SetOnEnqueue to
// Notify. Call Start to run it and Close to stop it.
func New(cfg Config, store *outbox.Store, d Deliverer) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("partition: new: %w", err)
	}
	if store == nil || d == nil {
		return nil, fmt.Errorf("partition: new: %w", ErrNilDependency)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relay{cfg: cfg, store: store, d: d, ctx: ctx, cancel: cancel}
	for i := range cfg.Partitions {
		r.parts = append(r.parts, &part{id: i, wake: make(chan struct{}, 1), rcpts: map[string]*rstate{}})
	}
	store.SetOnEnqueue(r.Notify)
	return r, nil
}

// Start runs the partition loops. Calling it again does nothing.
func (r *Relay) Start() {
	r.startOnce.Do(func() {
		if r.ctx.Err() != nil {
			return
		}
		r.started.Store(true)
		for _, p := range r.parts {
			r.wg.Add(1)
			go r.loop(p)
		}
	})
}

// Notify says something was enqueued for recipient. It never blocks.
func (r *Relay) Notify(recipient string) {
	r.parts[PartitionOf(recipient, len(r.parts))].signal()
}

// NodeAlive says membership reports node alive again: its queues become due
// at once and every partition wakes (rule 4); the AIMD limiter paces the
// drain.
func (r *Relay) NodeAlive(node string) {
	r.store.WakeNode(node)
	r.wakeAll()
}

func (r *Relay) wakeAll() {
	for _, p := range r.parts {
		p.signal()
	}
}

func (p *part) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Close stops the loops, cancels in-flight deliveries and waits for them.
// Messages of cancelled deliveries stay queued. Close is idempotent and
// always returns nil; it does not close the store.
func (r *Relay) Close() error {
	r.closeOnce.Do(func() {
		r.store.SetOnEnqueue(nil)
		r.cancel()
		r.wg.Wait()
	})
	return nil
}

// Stats returns counters of the relay.
func (r *Relay) Stats() Stats {
	return Stats{
		Iterations: r.iterations.Load(),
		Batches:    r.batches.Load(),
		Delivered:  r.delivered.Load(),
		Failed:     r.failed.Load(),
		Deferred:   r.deferred.Load(),
	}
}

func nodeOf(recipient string) string {
	if i := strings.LastIndexByte(recipient, '@'); i >= 0 {
		return recipient[i+1:]
	}
	return ""
}

// loop is one partition: it sleeps until the earliest send_at of its
// recipients or a wake-up, and starts at most one delivery per recipient.
func (r *Relay) loop(p *part) {
	defer r.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	keep := func(rcpt string) bool {
		if PartitionOf(rcpt, len(r.parts)) != p.id {
			return false
		}
		if p.busy(rcpt, r.cfg.MaxAckPending) {
			return false
		}
		// A node at its AIMD limit is skipped until a delivery of it
		// completes and wakes the loop; this is what keeps a full peer from
		// turning the loop into a spin.
		l := r.store.Limiter(nodeOf(rcpt))
		return l.InFlight() < l.Limit()
	}
	for {
		if r.ctx.Err() != nil {
			return
		}
		r.iterations.Add(1)
		now := time.Now()
		p.mu.Lock()
		due, next := r.store.DueRecipients(now, keep, r.cfg.MaxDue)
		p.mu.Unlock()
		started := 0
		for _, rcpt := range due {
			if r.dispatch(p, rcpt, now) {
				started++
			}
		}
		if len(due) == r.cfg.MaxDue && started > 0 {
			continue // more may be due right now
		}
		var tc <-chan time.Time
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 0))
			tc = timer.C
		}
		select {
		case <-r.ctx.Done():
			return
		case <-p.wake:
		case <-tc:
		}
		if tc != nil && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// dispatch starts a delivery of rcpt if its peer is alive and its limiter
// has room. It reports whether a delivery started.
func (r *Relay) dispatch(p *part, rcpt string, now time.Time) bool {
	node := nodeOf(rcpt)
	if !r.d.Alive(node) {
		// Rule 3: nothing is counted while the peer is down; NodeAlive
		// wakes it, DownRecheck is the safety net.
		r.deferDown(rcpt, node, now)
		return false
	}
	pending := r.store.Pending(rcpt)
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.rcpts[rcpt]
	if st != nil {
		if st.sending || st.ackBatches >= r.cfg.MaxAckPending {
			return false
		}
		pending -= len(st.acking) // still counted by the store until their Ack commits
	}
	n := min(r.cfg.BatchSize, pending)
	if n <= 0 {
		return false
	}
	lim := r.store.Limiter(node)
	g := lim.TryAcquire(n)
	if g == 0 {
		return false
	}
	if st == nil {
		st = &rstate{}
		p.rcpts[rcpt] = st
	}
	st.sending = true
	skip := slices.Clone(st.acking)
	r.wg.Add(1)
	go r.deliver(p, rcpt, node, lim, g, skip)
	return true
}

// settle updates rcpt's state under p.mu and forgets it when idle.
func (p *part) settle(rcpt string, f func(st *rstate)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.rcpts[rcpt]
	if st == nil {
		return
	}
	f(st)
	if st.idle() {
		delete(p.rcpts, rcpt)
	}
}

// deliver sends one batch of rcpt and processes the receipts in order.
//
// Pipelining: when every receipt is positive, the recipient is released
// for its next batch before the Ack has committed; the acked sequences
// stay in its acking list (skipped by HeadSkip) until the commit, and go
// back to being deliverable if the commit fails (the receiver's dedupe
// makes the redelivery harmless). After any non-positive receipt the
// recipient stays busy until the failure and the acks are recorded, so the
// next batch starts after a boundary the chain rule can see (its first
// message has PrevSequence 0 and the failed one is retried first).
func (r *Relay) deliver(p *part, rcpt, node string, lim *outbox.Limiter, slots int, skip []uint64) {
	defer r.wg.Done()
	released, sending := false, true
	release := func() {
		if !released {
			released = true
			lim.Release(slots)
		}
	}
	defer func() {
		release()
		if sending {
			p.settle(rcpt, func(st *rstate) { st.sending = false })
		}
		// Slots of node were released: any partition may have recipients
		// of it waiting.
		r.wakeAll()
	}()
	msgs, err := r.store.HeadSkip(rcpt, slots, skip)
	if err != nil {
		if r.ctx.Err() == nil {
			r.cfg.Logger.Warn("relay: head failed", "recipient", rcpt, "err", err)
		}
		return
	}
	if len(msgs) == 0 {
		return
	}
	envs := make([]*pb.Envelope, len(msgs))
	var prev uint64
	for i, m := range msgs {
		e := m.GetEnvelope()
		e.MsgId = mailbox.NewID() // unique per attempt; the idempotency key is the stable name
		e.Attempt = m.GetAttempts() + 1
		e.PrevSequence = prev
		prev = e.GetSequence()
		envs[i] = e
	}
	r.batches.Add(1)
	dctx, cancel := context.WithTimeout(r.ctx, r.cfg.DeliverTimeout)
	receipts, derr := r.d.Deliver(dctx, node, envs)
	cancel()
	// The peer's share of the work is over when the receipts are back:
	// free its AIMD slots now so other recipients of the node need not wait
	// for this batch's ack fsync.
	release()
	r.wakeAll()
	if r.ctx.Err() != nil {
		// Closing: whatever happened, the messages stay queued and are
		// redelivered later (rule 5); acks of positive receipts are still
		// attempted so they are not redelivered needlessly.
		derr = fmt.Errorf("partition: relay closing: %w", r.ctx.Err())
	}
	acks, clean := r.process(rcpt, node, lim, envs, receipts, derr)
	if len(acks) == 0 {
		return
	}
	if clean {
		// Every receipt positive: let the next batch go while this Ack
		// waits for its fsync.
		sending = false
		p.settle(rcpt, func(st *rstate) {
			st.sending = false
			st.ackBatches++
			st.acking = mergeSorted(st.acking, acks)
		})
		r.wakeAll()
	}
	err = r.store.Ack(rcpt, acks)
	if clean {
		p.settle(rcpt, func(st *rstate) {
			st.ackBatches--
			st.acking = removeSorted(st.acking, acks)
		})
	}
	if err != nil {
		r.cfg.Logger.Warn("relay: ack failed; messages will be redelivered", "recipient", rcpt, "err", err)
		return
	}
	r.delivered.Add(uint64(len(acks)))
}

// process applies the receipts of one batch in order and returns the
// sequences to ack; clean reports that every message came back positive.
// The first negative receipt decides the recipient's next attempt; later
// messages that did not come back positive stay queued, uncounted.
func (r *Relay) process(rcpt, node string, lim *outbox.Limiter, envs []*pb.Envelope, receipts []*pb.Receipt, derr error) (acks []uint64, clean bool) {
	failed := false
	for i, e := range envs {
		var rc *pb.Receipt
		if i < len(receipts) {
			rc = receipts[i]
		}
		code := rc.GetCode()
		if rc != nil && (code == pb.Receipt_PROCESSED || code == pb.Receipt_DUPLICATE) {
			acks = append(acks, e.GetSequence())
			lim.OnSuccess()
			continue
		}
		if failed {
			continue
		}
		failed = true
		r.failed.Add(1)
		seq := e.GetSequence()
		switch {
		case rc == nil:
			if r.ctx.Err() != nil {
				continue
			}
			if !r.d.Alive(node) {
				// The peer went down: rule 3, not counted.
				r.deferDown(rcpt, node, time.Now())
				continue
			}
			// Connection loss to a peer membership still calls alive is
			// treated as a transient failure: it counts, with backoff.
			lim.OnTransient()
			reason := "lost: no receipt"
			if derr != nil {
				reason = "lost: " + derr.Error()
			}
			r.fail(rcpt, seq, outbox.Failure{Reason: reason, Counts: true})
		case code == pb.Receipt_CAPACITY:
			lim.OnCapacity()
			ra := time.Duration(rc.GetRetryAfterMs()) * time.Millisecond
			if ra <= 0 {
				ra = 100 * time.Millisecond
			}
			r.store.Defer(rcpt, time.Now().Add(ra))
		case code == pb.Receipt_EXPIRED:
			r.fail(rcpt, seq, outbox.Failure{Reason: "expired", Permanent: true})
		case code == pb.Receipt_REJECTED:
			r.fail(rcpt, seq, outbox.Failure{Reason: "rejected: " + rc.GetMessage(), Permanent: true})
		case code == pb.Receipt_NO_SUCH_ACTOR:
			lim.OnTransient()
			r.fail(rcpt, seq, outbox.Failure{Reason: "no such actor: " + rc.GetMessage(), Counts: true})
		default: // TRANSIENT, and ACCEPTED / unknown codes, which prove nothing was processed
			lim.OnTransient()
			r.fail(rcpt, seq, outbox.Failure{Reason: "transient: " + code.String() + ": " + rc.GetMessage(), Counts: true})
		}
	}
	return acks, !failed && derr == nil
}

// mergeSorted returns the union of the ascending slices a and b.
func mergeSorted(a, b []uint64) []uint64 {
	out := make([]uint64, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if a[0] <= b[0] {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
}

// removeSorted returns a without the elements of the ascending slice b.
func removeSorted(a, b []uint64) []uint64 {
	out := a[:0]
	for _, v := range a {
		for len(b) > 0 && b[0] < v {
			b = b[1:]
		}
		if len(b) > 0 && b[0] == v {
			b = b[1:]
			continue
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// deferDown parks rcpt while its peer is down. If the peer came back between
// the Alive check and the Defer, NodeAlive's wake-up may already have run:
// checking again keeps rule 4 (drain at once) from waiting for DownRecheck.
func (r *Relay) deferDown(rcpt, node string, now time.Time) {
	r.store.Defer(rcpt, now.Add(r.cfg.DownRecheck))
	r.deferred.Add(1)
	if r.d.Alive(node) {
		r.store.WakeNode(node)
		r.wakeAll()
	}
}

func (r *Relay) fail(rcpt string, seq uint64, f outbox.Failure) {
	if _, err := r.store.Fail(rcpt, seq, f); err != nil {
		r.cfg.Logger.Warn("relay: recording a failure", "recipient", rcpt, "seq", seq, "err", err)
	}
}

package partition

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Deliverer is what the relay needs from the network. The relay is tested
// with a fake.
type Deliverer interface {
	// Alive reports the membership view of node; it must be fast and must
	// not block.
	Alive(node string) bool
	// Deliver sends one emission of one stream: msgs are for one
	// recipient, in sequence order, each naming the one before it
	// (PrevSequence; the first names 0, or the last message of the
	// stream's emission still in flight). It returns one receipt per message
	// in order; a nil receipt means none came back (err says why). An
	// envelope that could not be put on the wire at all is reported in err
	// as an *UnsendableError while the others are sent; a full local send
	// queue wraps ErrCongested. It must return when ctx ends.
	//
	// A Deliverer of this module also says, through ctx (internal/queued),
	// when msgs are queued on their path behind anything queued there
	// before: the relay then sends the stream's next emission without
	// waiting for these receipts. A Deliverer that does not say so gets
	// one emission per stream at a time.
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
	Iterations  uint64         // loop iterations, all partitions (an idle relay does none)
	Batches     uint64         // emissions sent by the relay (direct attempts not included)
	ReadAhead   uint64         // of those, emissions read while the one before awaited its receipts
	Pipelined   uint64         // of those, emissions sent while the one before awaited its receipts
	Direct      uint64         // direct attempts made by Send
	Delivered   uint64         // messages acked after a positive receipt
	Failed      uint64         // emissions that ended with a non-positive or missing receipt
	Deferred    uint64         // deferrals: peer down, full, lost receipt, spawn grace (never counted)
	OutOfOrder  uint64         // OUT_OF_ORDER receipts (resent from the frontier)
	Restores    uint64         // streams whose sender state was found to have gone back (new epoch)
	Forwarded   uint64         // messages sent through a forwarder whose receipt came back signed (route.go)
	Reroutes    uint64         // peers moved to a forwarder or back to the direct path
	InFlight    int            // AIMD slots held now, all peers
	LimitByPeer map[string]int // current AIMD limit per peer
}

// Relay owns every decision on the sending side of reliable streams: it
// assigns sequences, chooses between a direct attempt and the outbox,
// sends each stream in order, reads the receiver's verdicts and paces
// every peer with its AIMD limiter. The outbox stores; the relay decides.
type Relay struct {
	cfg   Config
	store *outbox.Store
	d     Deliverer
	parts []*part
	skew  int64 // the store's MaxClockSkew in ms

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // loops, the sweeper and delivery goroutines

	startOnce, closeOnce sync.Once
	started              atomic.Bool

	// strays maps a recipient to the highest sequence of its messages that
	// went through a forwarder and came back without the recipient's
	// verdict (markStrays): a copy of any of them may still be on its way.
	// Only streams that were forwarded have an entry; it goes with the
	// stream.
	strays sync.Map // string -> uint64
	// replaying holds the sequences Reserve gave to a Replay and whose
	// commit has not ended; reserveWaiting counts Reserve calls waiting
	// for sends' commits (waitStored), which doneStoring wakes by closing
	// storedWake (guarded by storedMu) while there are any.
	replaying      sync.Map // uint64 -> struct{}
	reserveWaiting atomic.Int32
	storedMu       sync.Mutex
	storedWake     chan struct{}

	// runFloor is what the outbox's MarkForwarding returned when the relay
	// was made (0 when no run ever forwarded): a message below it was
	// stored by an earlier run, which may have sent it through a forwarder
	// without an answer, and that run's strays are gone (mayStray).
	runFloor uint64

	// sweepAt is when the sweeper will next look (elapsed ms); sweepWake
	// (cap 1) brings it forward when a message with an earlier give-up
	// time is stored.
	sweepAt   atomic.Int64
	sweepWake chan struct{}
	// expireWait is the sweeper's wait after its give-ups were refused by
	// the disk (0 after one that was not). Owned by the sweeper, as is
	// the pass below.
	expireWait time.Duration
	// A pass of the sweeper over the expiry candidates takes several looks
	// when more than expiryLook of them cannot be given up yet: expireFrom
	// is the last of the previous look (zero: the pass starts), passWake
	// the earliest time one skipped so far can be (0: none), passBusy
	// whether one skipped was its emission's or its Ack's to decide.
	expireFrom outbox.Expiring
	passWake   int64
	passBusy   bool
	// storedSince is the earliest TTL deadline of a message stored since
	// the pass began (0: none; expiresAt): its commit may land behind the
	// cursor, after the look that would have seen it.
	storedSince atomic.Int64

	// committed carries SendAsync's commits to the complete goroutine.
	committed commits

	// lmu guards the field below.
	lmu      sync.Mutex
	limiters map[string]*Limiter // per peer node
	limPeak  int                 // see shrinkDelete

	// xmu makes "is the node's limiter full?" and the store's
	// ExcludeNode/IncludeNode that acts on the answer one step, so that a
	// release between the two cannot leave a node with free slots
	// excluded (scan.go). Lock order: stream.mu, then xmu, then the
	// store's locks.
	xmu sync.Mutex

	routes *routes // the path to each peer: direct or through a forwarder (route.go)

	ahead aheads // streams' next emissions read ahead (ahead.go)

	failedAcks failedAcks // Acks to retry (ackretry.go)

	// afterLookup, set only by tests before Start, runs in lockStream
	// between finding a stream and locking it.
	afterLookup func(rcpt string)
	// onFollow, set only by tests before Start, hears each of follow's
	// decisions: whether it sent an emission early behind the one whose
	// highest sequence is top.
	onFollow func(top uint64, sent bool)
	// ack is store.Ack; tests that make a disk fail replace it before Start.
	ack func(recipient string, seqs []uint64) error

	// queues: the Deliverer said it queued an emission (follow).
	queues atomic.Bool

	iterations, batches, direct, delivered, failed atomic.Uint64
	deferred, outOfOrder, restores, pipelined      atomic.Uint64
}

// part is one partition: one loop and the streams it drains.
type part struct {
	id   int
	wake chan struct{} // cap 1: a pending wake-up

	// mu guards the field below. It is held only for map operations. Lock
	// order: stream.mu, then the store's own locks, then part.mu: the
	// loop's keep filter takes part.mu under the store's read lock, and
	// Send and dispatch ask the store while holding their stream.
	mu      sync.Mutex
	streams map[string]*stream
	peak    int // see shrinkDelete
}

// New builds a relay over store and d and hooks store.SetOnEnqueue to
// Notify. Call Start to run it and Close to stop it; Close it also when it
// was never started (it runs the goroutine that ends SendAsync's storing
// state from New on).
func New(cfg Config, store *outbox.Store, d Deliverer) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err // reads "partition: bad config: ..." already
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Logger = cfg.Logger.With("component", "relay")
	if store == nil || d == nil {
		return nil, fmt.Errorf("partition: new: %w", ErrNilDependency)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relay{cfg: cfg, store: store, d: d, ctx: ctx, cancel: cancel, limiters: map[string]*Limiter{},
		skew: store.Config().MaxClockSkew.Milliseconds(), sweepWake: make(chan struct{}, 1), storedWake: make(chan struct{}),
		committed: commits{wake: make(chan struct{}, 1)}}
	r.ack = store.Ack
	for i := range cfg.Partitions {
		r.parts = append(r.parts, &part{id: i, wake: make(chan struct{}, 1), streams: map[string]*stream{}})
	}
	r.routes = newRoutes(r, d, cfg.Forward)
	// What is stored below runFloor may have been sent through a forwarder
	// by an earlier run, whatever this one does; the mark makes a later
	// run know that this one forwards.
	floor, err := store.MarkForwarding(r.routes.rt != nil)
	if err != nil {
		if r.routes.rt != nil {
			// A later run would not know what this one forwarded: it
			// sends direct only.
			cfg.Logger.Warn("relay: forwarding is off for this run: the outbox could not record that it forwards", "err", err)
			r.routes.rt = nil
		}
		floor = math.MaxUint64 // an earlier run may have forwarded anything
	}
	r.runFloor = floor
	store.SetOnEnqueue(r.Notify)
	store.SetOnExpiry(r.expiresAt)
	if c, ok := store.Config().Clock.(interface{ OnAdvance(func()) }); ok {
		// A test clock jumped: deferrals and give-up times may be due.
		c.OnAdvance(r.wake)
	}
	store.SetSequencer(r)
	// The completer runs from here, not from Start: a Replay before Start
	// (the sequencer is installed already) waits for what SendAsync is
	// storing, which only the completer takes off its streams.
	r.wg.Add(1)
	go r.complete()
	return r, nil
}

// Start runs the partition loops, the expiry sweeper and the goroutine that
// releases SendAsync's commits to their streams. Calling it again does
// nothing. Until Start, Send stores every message (no direct attempt).
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
		r.wg.Add(1)
		go r.sweep()
	})
}

// Notify says something was enqueued for recipient. It never blocks.
func (r *Relay) Notify(recipient string) {
	r.parts[PartitionOf(recipient, len(r.parts))].signal()
}

// NodeAlive says membership reports node alive again: its queues become due
// at once and every partition wakes; the AIMD limiter paces the drain.
func (r *Relay) NodeAlive(node string) {
	r.store.WakeNode(node)
	r.wakeAll()
}

// wake wakes every loop and the sweeper.
func (r *Relay) wake() {
	r.wakeAll()
	select {
	case r.sweepWake <- struct{}{}:
	default:
	}
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

// Close stops the loops, cancels in-flight emissions and waits for them.
// Their messages stay queued. Close is idempotent and always returns nil;
// it does not close the store.
func (r *Relay) Close() error {
	r.closeOnce.Do(func() {
		r.store.SetOnEnqueue(nil)
		r.store.SetOnExpiry(nil)
		// The relay stays the store's sequencer and refuses (Reserve):
		// a Replay with plain sequences would not wait for the sends
		// still storing, and could put an older version above theirs.
		r.cancel()
		r.wg.Wait()
		r.retryAcks() // last chance: what still fails is answered DUPLICATE after a restart
		r.routes.close()
	})
	return nil
}

// Stats returns counters of the relay.
func (r *Relay) Stats() Stats {
	s := Stats{
		Iterations:  r.iterations.Load(),
		Batches:     r.batches.Load(),
		ReadAhead:   r.ahead.used.Load(),
		Pipelined:   r.pipelined.Load(),
		Direct:      r.direct.Load(),
		Delivered:   r.delivered.Load(),
		Failed:      r.failed.Load(),
		Deferred:    r.deferred.Load(),
		OutOfOrder:  r.outOfOrder.Load(),
		Restores:    r.restores.Load(),
		LimitByPeer: map[string]int{},
		Forwarded:   r.routes.forwarded.Load(),
		Reroutes:    r.routes.switches.Load(),
	}
	r.lmu.Lock()
	for n, l := range r.limiters {
		s.LimitByPeer[n] = l.Limit()
		s.InFlight += l.InFlight()
	}
	r.lmu.Unlock()
	return s
}

// Limiter returns the AIMD limiter of a peer node, creating it on first use.
func (r *Relay) Limiter(node string) *Limiter {
	r.lmu.Lock()
	defer r.lmu.Unlock()
	l := r.limiters[node]
	if l == nil {
		l = NewLimiter(r.cfg.Limiter)
		r.limiters[node] = l
	}
	return l
}

// ForgetPeer drops what the relay keeps in memory for node once it has
// left the cluster: its AIMD limiter, its route and the streams of its
// recipients. It reports whether it did: while anything is queued for node
// or in flight to it (slots held, an emission or a direct attempt
// unresolved, a message being stored) it keeps everything and returns
// false, and the caller tries again later. Nothing on disk is touched; if
// node comes back its state is made again from the store (a new limiter
// starts at Limiter.Initial).
func (r *Relay) ForgetPeer(node string) bool {
	if r.store.NodeQueued(node) > 0 {
		return false
	}
	r.lmu.Lock()
	l := r.limiters[node]
	r.lmu.Unlock()
	if l != nil && l.InFlight() > 0 {
		return false
	}
	if !r.forgetStreams(node) {
		return false
	}
	r.routes.forget(node)
	r.lmu.Lock()
	if l := r.limiters[node]; l != nil {
		if l.InFlight() > 0 {
			r.lmu.Unlock()
			return false // a send began meanwhile
		}
		shrinkDelete(&r.limiters, &r.limPeak, node)
	}
	r.lmu.Unlock()
	// Not under lmu: the scan's filter takes lmu under the store's lock.
	// A node is excluded only while it holds slots, so this is a no-op
	// but for a store shared with another relay; it keeps the store's
	// exclusions from outliving the peer.
	r.store.IncludeNode(node)
	return true
}

// forgetStreams drops the settled streams of node's recipients and reports
// whether none is left (one still busy keeps the peer).
func (r *Relay) forgetStreams(node string) bool {
	idle := true
	for _, p := range r.parts {
		var of []*stream
		p.mu.Lock()
		for _, st := range p.streams {
			if st.node == node {
				of = append(of, st)
			}
		}
		p.mu.Unlock()
		for _, st := range of {
			st.mu.Lock() // the stream before the partition: see part.mu
			if st.settled() {
				p.mu.Lock()
				if p.streams[st.rcpt] == st {
					shrinkDelete(&p.streams, &p.peak, st.rcpt)
					st.gone = true
					r.dropAhead(st)
					r.strays.Delete(st.rcpt)
				}
				p.mu.Unlock()
			} else {
				idle = false
			}
			st.mu.Unlock()
		}
	}
	return idle
}

// loop is one partition: it sleeps until the earliest send_at of its
// recipients or a wake-up, and starts at most one emission per stream.
func (r *Relay) loop(p *part) {
	defer r.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		if r.ctx.Err() != nil {
			return
		}
		r.iterations.Add(1)
		now := r.store.ElapsedMs()
		due, next := r.scan(p, now)
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
		if next != 0 {
			timer.Reset(max(time.Duration(next-now)*time.Millisecond, time.Millisecond))
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

// deferFor pushes rcpt's send_at d into the future.
func (r *Relay) deferFor(rcpt string, d time.Duration) {
	r.deferred.Add(1)
	r.store.Defer(rcpt, r.store.ElapsedMs()+max(d.Milliseconds(), 1))
}

// deferDown parks rcpt while its peer is down. If the peer came back between
// the Alive check and the Defer, NodeAlive's wake-up may already have run:
// checking again keeps the drain from waiting for DownRecheck.
func (r *Relay) deferDown(rcpt, node string) {
	r.dropAheadOf(rcpt) // its peer may be gone for hours: free the place and the memory
	r.deferFor(rcpt, r.cfg.DownRecheck)
	if r.d.Alive(node) {
		r.store.WakeNode(node)
		r.wakeAll()
	}
}

// sweep gives up messages whose TTL or age ran out, also while their peer
// is down (when no emission reads the queue). It sleeps until the next
// give-up time the store knows, at most a minute, or until a message with
// an earlier one is stored.
func (r *Relay) sweep() {
	defer r.wg.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-timer.C:
		case <-r.sweepWake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		wait := min(max(r.sweepOnce(), 10*time.Millisecond), time.Minute)
		r.sweepAt.Store(r.store.ElapsedMs() + wait.Milliseconds())
		timer.Reset(wait)
	}
}

// expiresAt is the store's hook: a message whose TTL ends at deadlineMs was
// stored. It wakes the sweeper if that is before its next look.
func (r *Relay) expiresAt(deadlineMs int64) {
	for {
		cur := r.storedSince.Load()
		if (cur != 0 && cur <= deadlineMs) || r.storedSince.CompareAndSwap(cur, deadlineMs) {
			break
		}
	}
	if deadlineMs < r.sweepAt.Load() {
		select {
		case r.sweepWake <- struct{}{}:
		default:
		}
	}
}

// sweepOnce retries failed Acks, expires what is due and returns how long
// to wait for the next look.
func (r *Relay) sweepOnce() time.Duration {
	ackWait, retrying := r.retryAcks()
	wait := r.expireDue()
	if retrying {
		wait = min(wait, ackWait)
	}
	return wait
}

// expiryLook is how many candidates the sweeper reads at a time.
const expiryLook = 1024

// earliest is the earlier of two times, 0 being none.
func earliest(a, b int64) int64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// expireDue expires what is due and returns how long to wait for the next.
// It reads expiryLook candidates at a time; when it could give none of a
// full look up, it goes on after them at once rather than read the same
// again, so that however many wait out the clock skew or are in flight,
// they hold back no later one that is due.
func (r *Relay) expireDue() time.Duration {
	if r.expireFrom == (outbox.Expiring{}) {
		r.storedSince.Store(0) // a pass begins
	}
	now := r.store.ElapsedMs()
	cands, next, err := r.store.ExpiryCandidatesAfter(now, expiryLook, r.expireFrom)
	if err != nil {
		r.expireFrom, r.passWake, r.passBusy = outbox.Expiring{}, 0, false
		if r.ctx.Err() == nil {
			r.cfg.Logger.Warn("relay: expiry sweep", "err", err)
		}
		return time.Minute
	}
	// A full look stopped at candidates with a TTL deadline: the next one
	// goes on after the last of them.
	full := len(cands) >= expiryLook && cands[len(cands)-1].DeadlineMs != 0
	wake := int64(0) // the earliest time one skipped here can be given up
	type group struct {
		seqs   []uint64
		reason string
	}
	byKey := map[string]*group{}
	busy := false
	for _, c := range cands {
		st := r.part(c.Recipient).lookup(c.Recipient)
		emitted := uint64(0)
		if st != nil {
			st.mu.Lock()
			inFlight := st.direct || st.sending
			_, acking := slices.BinarySearch(st.acking, c.Seq) // receipted, its Ack committing
			emitted = st.emittedHW
			st.mu.Unlock()
			if inFlight || acking {
				busy = true // its emission or its Ack decides; look again soon
				continue
			}
		} else if _, hw, err := r.store.StreamState(c.Recipient); err == nil {
			emitted = hw
		}
		reason := outbox.TooOldReason(c.Seq, emitted)
		if c.DeadlineMs != 0 {
			switch {
			case c.Seq > emitted:
				reason = outbox.ReasonExpired // never on the wire: no copy can run
			case c.DeadlineMs+r.skew <= now:
				reason = outbox.ReasonExpiredUnknown
			default:
				// A copy may still be at the receiver, whose clock measures
				// the same TTL: wait out the skew.
				wake = earliest(wake, c.DeadlineMs+r.skew)
				continue
			}
		}
		k := c.Recipient + "\x00" + reason
		g := byKey[k]
		if g == nil {
			g = &group{reason: reason}
			byKey[k] = g
		}
		g.seqs = append(g.seqs, c.Seq)
	}
	refused := false
	for k, g := range byKey {
		rcpt, _, _ := strings.Cut(k, "\x00")
		if _, err := r.store.Expire(rcpt, g.seqs, g.reason); err != nil {
			refused = true
			if r.ctx.Err() == nil {
				r.cfg.Logger.Warn("relay: expire", "recipient", rcpt, "err", err)
			}
		}
	}
	if len(byKey) > 0 {
		r.wakeAll()
	}
	if refused {
		// The disk refused: looking again at once would meet it again.
		r.expireFrom, r.passWake, r.passBusy = outbox.Expiring{}, 0, false
		r.expireWait = nextWriteRetry(r.expireWait)
		return r.expireWait
	}
	r.expireWait = 0
	r.passWake, r.passBusy = earliest(r.passWake, wake), r.passBusy || busy
	if full {
		// Go on after this look at once: later candidates may be due.
		r.expireFrom = cands[len(cands)-1]
		return 0
	}
	// The pass is over: what it skipped, and what was stored meanwhile
	// (it may be behind where the pass went on from), decide when to look
	// again.
	next, busy = earliest(earliest(next, r.passWake), r.storedSince.Load()), r.passBusy
	r.expireFrom, r.passWake, r.passBusy = outbox.Expiring{}, 0, false
	switch {
	case len(byKey) > 0:
		// More may be due at once (the next head of an old queue); a busy
		// candidate is looked at again then too, and holds no other back.
		return 0
	case busy && (next == 0 || next-now >= time.Second.Milliseconds()):
		return time.Second // its emission or Ack decides; nothing else was due
	case next == 0:
		return time.Minute
	}
	return time.Duration(max(next-now, 0)) * time.Millisecond
}

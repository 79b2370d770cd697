package partition

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/address"
	"github.com/meshnode/meshnode/internal/queued"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// stream is the sending side of one reliable stream: this node's outbox to
// one recipient. Its lock serializes the stream: under it a sequence is
// assigned, the path (direct or outbox) chosen and an emission started; it
// is never held while waiting for receipts or a commit of messages.
//
// The fields are ordered so that the struct is 128 bytes, an allocation
// class of its own, rather than 152 rounded up to 160: a relay keeps one
// per recipient it has sent to.
type stream struct {
	rcpt, node string

	// blocked mirrors "cannot start an emission now" for the loop's
	// filter, which must not take mu (it runs under the store's lock).
	blocked atomic.Bool

	// The four flags below are guarded by mu; they sit here, beside
	// blocked, so that the struct packs.
	//
	// direct: a direct attempt is unresolved (until its message is settled
	// or stored). sending: a relay emission awaits its receipts.
	direct, sending bool
	// waitStoring: the last emission found nothing to send below
	// storing[0]; the stream waits for doneStoring instead of the loop
	// trying again at once (which would spin until the commit).
	waitStoring bool
	// gone: forget dropped the stream from its partition; whoever still
	// holds it must look the recipient up again (lockStream).
	gone bool

	// mu guards the four flags above and the fields below.
	mu sync.Mutex
	// epoch is the stream's current epoch (persisted by the store).
	epoch uint64
	// emittedHW is the highest sequence that may have been on the wire:
	// what was stored before this run, and what this run sent. A receiver
	// watermark above it means this sender's state went back.
	emittedHW uint64
	// storing lists, ascending, sequences handed to the store and not yet
	// committed: nothing at or above the lowest may be sent, since it may
	// still appear below messages that were.
	storing []uint64
	// acking lists, ascending, sequences positively receipted whose Ack is
	// still committing; ackBatches counts those Acks.
	acking     []uint64
	ackBatches int
	// deferrals counts deferrals since the last positive receipt: the
	// backoff exponent for delays nobody is charged for.
	deferrals int32
	// proven: an emission came back clean in the stream's epoch since it
	// was loaded, so the receiver's watermark is one this stream set. A
	// restore shows in the first emission alone; until then follow sends
	// nothing early, since a watermark of a sequence that went early
	// would look like one this stream set.
	proven bool
	// room is what the receiver said its mailbox could take in the last
	// receipts the stream read, plus one (capped at 2^16-1; 0: it said
	// nothing): the stream's next emission from the frontier, with nothing
	// of the stream in flight, takes no more (dispatch, firstEarly).
	room uint16
}

// settled reports that nothing of the stream is unresolved: a direct
// attempt may go. Caller holds st.mu.
func (st *stream) settled() bool {
	return !st.direct && !st.sending && len(st.storing) == 0 && st.ackBatches == 0
}

// updateBlocked recomputes blocked. Caller holds st.mu.
func (st *stream) updateBlocked(maxAck int) {
	st.blocked.Store(st.direct || st.sending || st.ackBatches >= maxAck || st.waitStoring)
}

// idle reports that the relay holds nothing of the stream in memory that
// it cannot reload from the store. Caller holds st.mu.
func (st *stream) idle() bool { return st.settled() && st.deferrals == 0 }

func (p *part) lookup(rcpt string) *stream {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streams[rcpt]
}

func (r *Relay) part(rcpt string) *part { return r.parts[PartitionOf(rcpt, len(r.parts))] }

// stream returns rcpt's stream, loading its epoch and high-water from the
// store the first time.
func (r *Relay) stream(rcpt string) (*stream, error) {
	p := r.part(rcpt)
	if st := p.lookup(rcpt); st != nil {
		return st, nil
	}
	epoch, hw, err := r.store.StreamState(rcpt)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.streams[rcpt]; st != nil {
		return st, nil
	}
	st := &stream{rcpt: rcpt, node: address.Node(rcpt), epoch: epoch, emittedHW: hw}
	p.streams[rcpt] = st
	return st, nil
}

// forget drops st from memory when it is idle and nothing waits for it.
func (r *Relay) forget(st *stream) {
	if r.store.Pending(st.rcpt) > 0 {
		return
	}
	p := r.part(st.rcpt)
	st.mu.Lock() // the stream before the partition: see part.mu
	defer st.mu.Unlock()
	if !st.idle() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streams[st.rcpt] == st {
		shrinkDelete(&p.streams, &p.peak, st.rcpt)
		st.gone = true
		r.dropAhead(st)
		r.strays.Delete(st.rcpt) // nothing of it is queued: no stray copy can be judged
	}
}

// markStrays records that an emission of rcpt's stream went through the
// forwarder via and that those of envs with no verdict of the recipient
// in rcs (lost, timed out, or the forwarder's own word) may still reach
// it: the forwarder may hold a copy in its queue to the recipient, which
// arrives after later copies were answered. The highest such sequence is
// kept (strays).
func (r *Relay) markStrays(rcpt, via string, envs []*pb.Envelope, rcs []*pb.Receipt) {
	if via == "" {
		return
	}
	var top uint64
	for i, e := range envs {
		if i < len(rcs) && rcs[i].GetCode() > pb.Receipt_ACCEPTED {
			continue // the recipient answered this copy
		}
		top = max(top, e.GetSequence())
	}
	for top != 0 {
		old, loaded := r.strays.LoadOrStore(rcpt, top)
		if !loaded || old.(uint64) >= top || r.strays.CompareAndSwap(rcpt, old, top) {
			return
		}
	}
}

// mayStray reports that a copy of rcpt's message seq may still be on its
// way through a forwarder: markStrays said so, or the message is older than
// this run (runFloor), whose earlier runs' strays were not kept.
func (r *Relay) mayStray(rcpt string, seq uint64) bool {
	if seq < r.runFloor {
		return true
	}
	v, ok := r.strays.Load(rcpt)
	return ok && seq <= v.(uint64)
}

// strayNote is what a failure's reason adds when a copy of rcpt's message
// seq may still be on its way through a forwarder (mayStray): this copy
// failed, but that one may run when it arrives (the actor spawned, the
// handler's dependency back), so a dead letter with this reason may have
// run.
func (r *Relay) strayNote(rcpt string, seq uint64) string {
	if r.mayStray(rcpt, seq) {
		return outbox.OutcomeUnknownForwarded
	}
	return ""
}

// sentNote is strayNote for a failure the recipient did not judge by the
// stream's watermark (no such actor, or a copy that cannot be put on the
// wire): an earlier copy of the message (seq at or below seen, the
// stream's emitted high-water before this emission) may have run without
// its receipt coming back, which such a failure does not rule out.
func (r *Relay) sentNote(rcpt string, seq, seen uint64) string {
	if n := r.strayNote(rcpt, seq); n != "" {
		return n
	}
	if seq <= seen {
		return outbox.OutcomeUnknownSent
	}
	return ""
}

// lockStream returns rcpt's stream with its mutex held. A caller that
// found the stream just before forget dropped it would otherwise work on
// an object nobody else sees, beside the new one the next caller gets:
// two direct attempts, or an attempt and an emission, at once.
func (r *Relay) lockStream(rcpt string) (*stream, error) {
	for {
		st, err := r.stream(rcpt)
		if err != nil {
			return nil, err
		}
		if r.afterLookup != nil {
			r.afterLookup(rcpt)
		}
		st.mu.Lock()
		if !st.gone {
			return st, nil
		}
		st.mu.Unlock()
	}
}

// Outcome says what Send achieved.
type Outcome int

const (
	// Delivered: the recipient's handler returned without error.
	Delivered Outcome = iota + 1
	// Queued: stored in the outbox (fsynced); the relay delivers it.
	Queued
	// DeadLettered: the direct attempt's verdict was final (poison, or
	// the TTL ran out on the way); the message is in the dead-letter queue.
	DeadLettered
)

// Sent is Send's result.
type Sent struct {
	Outcome Outcome
	Reason  string // DeadLettered: why
}

// Send sends one reliable message (its envelope fully set but for the
// sequence and the per-emission fields). When tryDirect is set, the peer
// alive, the relay started, the stream settled and a slot free in the
// peer's AIMD limit, it makes one direct attempt bounded by DirectTimeout
// and returns Delivered when the handler succeeded. Otherwise, or when that
// attempt gives no final verdict, it stores the message and returns Queued
// once fsynced. It returns an error only when the message could not be
// stored either (then nothing was stored, though after a direct attempt
// without a verdict the recipient may have run it: the error wraps
// ErrOutcomeUnknown), when such an attempt outlasted the message's TTL
// (dead-lettered "outcome unknown"; ErrOutcomeUnknown too), or when ctx
// ended before anything was done.
func (r *Relay) Send(ctx context.Context, sm *pb.StoredMessage, tryDirect bool) (Sent, error) {
	if r.ctx.Err() != nil {
		return Sent{}, ErrClosed
	}
	if sm.GetCreatedElapsedMs() == 0 {
		// Zero means now, as in Enqueue; the direct attempt's wire TTL is
		// counted from it before the store ever sees the message.
		sm.CreatedElapsedMs = r.store.ElapsedMs()
	}
	rcpt := sm.GetEnvelope().GetRecipient()
	st, err := r.lockStream(rcpt)
	if err != nil {
		return Sent{}, fmt.Errorf("partition: send to %s: %w", rcpt, err)
	}
	lim := r.Limiter(st.node)
	seq, err := r.store.ReserveSequence()
	if err != nil {
		st.mu.Unlock()
		return Sent{}, fmt.Errorf("partition: send to %s: %w", rcpt, err)
	}
	env := sm.GetEnvelope()
	env.Sequence = seq
	direct := tryDirect && r.started.Load() && st.settled() && r.store.Pending(rcpt) == 0 &&
		r.d.Alive(st.node) && !r.routes.forwarding(st.node) && lim.TryAcquire(1) == 1
	noteFailed := false
	if key := env.GetCoalesceKey(); direct && env.GetConflict() == pb.Envelope_OVERWRITE && key != "" {
		// Delivered now, it is never stored, so its version goes into the
		// coalesce index first, durably and under the stream's lock: a
		// Replay of an older version (which reserves its sequence under
		// this lock) then finds it, during the attempt or after a crash
		// right after it. Without the note there is no attempt: the
		// message is stored, or the send fails as one that must be.
		if r.store.NoteVersion(context.WithoutCancel(ctx), rcpt, key, seq) != nil {
			direct, noteFailed = false, true
		}
	}
	var wire *pb.Envelope
	var seen uint64
	if direct {
		st.direct = true
		st.updateBlocked(r.cfg.MaxAckPending)
		seen, st.emittedHW = st.emittedHW, max(st.emittedHW, seq)
		wire = r.wire(sm, 0, st.epoch, r.store.ElapsedMs())
	} else {
		st.storing = append(st.storing, seq)
	}
	st.mu.Unlock()
	if noteFailed {
		r.release(st.node, lim, 1)
	}
	sctx := context.WithoutCancel(ctx) // once begun, storing finishes whatever the caller does
	if !direct {
		_, err := r.store.Enqueue(sctx, sm)
		r.doneStoring(st, seq)
		if err != nil {
			return Sent{}, fmt.Errorf("partition: send to %s: %w", rcpt, err)
		}
		return Sent{Outcome: Queued}, nil
	}
	r.direct.Add(1)
	dctx, cancel := context.WithTimeout(ctx, r.cfg.DirectTimeout)
	stop := context.AfterFunc(r.ctx, cancel) // Close cancels it like any emission
	rcs, via, derr := r.routes.deliver(dctx, st.node, []*pb.Envelope{wire})
	r.markStrays(st.rcpt, via, []*pb.Envelope{wire}, rcs)
	stop()
	cancel()
	r.release(st.node, lim, 1)
	var rc *pb.Receipt
	if len(rcs) > 0 {
		rc = rcs[0]
	}
	v := r.judge(st, wire, rc, derr, 0, seen, []*pb.Envelope{wire})
	if v.capacity {
		lim.OnCapacity()
	}
	if v.kind != vRestored {
		st.unsent(seen, []*pb.Envelope{wire}, rcs)
	}
	defer func() {
		st.mu.Lock()
		st.direct = false
		st.updateBlocked(r.cfg.MaxAckPending)
		st.mu.Unlock()
		r.Notify(rcpt)
		r.forget(st) // a settled stream is reloaded from the store when needed
	}()
	switch v.kind {
	case vPositive:
		return Sent{Outcome: Delivered}, nil
	case vPoison, vExpired:
		sm.FirstEnqueuedUnixMs = time.Now().UnixMilli()
		if err := r.store.DeadLetter(sctx, sm, v.reason); err != nil {
			return Sent{}, fmt.Errorf("partition: send to %s: %w", rcpt, err)
		}
		return Sent{Outcome: DeadLettered, Reason: v.reason}, nil
	case vCounted:
		sm.Attempts, sm.LastError = 1, v.reason
	case vRestored:
		r.newEpoch(st)
	}
	// No final verdict: the message is stored under the sequence it was
	// sent with, and the stream stays unsettled until it is.
	if v.kind == vCounted && r.store.Config().MaxAttempts <= 1 {
		sm.FirstEnqueuedUnixMs = time.Now().UnixMilli()
		if err := r.store.DeadLetter(sctx, sm, "max attempts: "+v.reason); err != nil {
			return Sent{}, fmt.Errorf("partition: send to %s: %w", rcpt, err)
		}
		return Sent{Outcome: DeadLettered, Reason: "max attempts: " + v.reason}, nil
	}
	if _, err := r.store.Enqueue(sctx, sm); err != nil {
		if errors.Is(err, outbox.ErrExpired) {
			// The TTL ran out during the attempt, which may have run: it
			// can be neither stored nor called failed.
			sm.FirstEnqueuedUnixMs = time.Now().UnixMilli()
			if err := r.store.DeadLetter(sctx, sm, outbox.ReasonExpiredUnknown); err != nil {
				return Sent{}, fmt.Errorf("partition: send to %s: its TTL ran out during a direct attempt without a verdict, and it could not be dead-lettered: %w: %w", rcpt, ErrOutcomeUnknown, err)
			}
			// Not DeadLettered, which says the message will not run.
			return Sent{}, fmt.Errorf("partition: send to %s: its TTL ran out during a direct attempt without a verdict, and it was dead-lettered %q: %w", rcpt, outbox.ReasonExpiredUnknown, ErrOutcomeUnknown)
		}
		// The attempt had no final verdict: the recipient may have run the
		// message (a timeout, or a receiver that ran it but could not
		// record that). Say so: "not stored" alone reads as "nothing
		// happened", and a retry without an idempotency key would run it
		// again.
		why := ""
		if v.reason != "" {
			why = " (" + v.reason + ")"
		}
		return Sent{}, fmt.Errorf("partition: send to %s: not stored after a direct attempt without a verdict%s: %w: %w", rcpt, why, ErrOutcomeUnknown, err)
	}
	r.apply(st, v, seq, false, int(sm.GetAttempts()))
	return Sent{Outcome: Queued}, nil
}

// Store stores messages for many recipients (a fan-out) without a direct
// attempt, and returns one error per message (nil = stored, or dropped as a
// superseded OVERWRITE version).
func (r *Relay) Store(ctx context.Context, sms []*pb.StoredMessage) []error {
	errs := make([]error, len(sms))
	if r.ctx.Err() != nil {
		for i := range errs {
			errs[i] = ErrClosed
		}
		return errs
	}
	streams := make([]*stream, len(sms))
	var batch []*pb.StoredMessage
	var idx []int
	for i, sm := range sms {
		rcpt := sm.GetEnvelope().GetRecipient()
		st, err := r.lockStream(rcpt)
		if err != nil {
			errs[i] = fmt.Errorf("partition: store for %s: %w", rcpt, err)
			continue
		}
		seq, err := r.store.ReserveSequence()
		if err == nil {
			sm.GetEnvelope().Sequence = seq
			st.storing = append(st.storing, seq)
		}
		st.mu.Unlock()
		if err != nil {
			errs[i] = fmt.Errorf("partition: store for %s: %w", rcpt, err)
			continue
		}
		streams[i] = st
		batch, idx = append(batch, sm), append(idx, i)
	}
	_, berrs := r.store.EnqueueBatch(context.WithoutCancel(ctx), batch)
	for j, i := range idx {
		errs[i] = berrs[j]
		r.doneStoring(streams[i], sms[i].GetEnvelope().GetSequence())
	}
	return errs
}

// Reserve is outbox.Sequencer: the store's Replay takes its sequences
// here, so they are registered as storing like Send's.
func (r *Relay) Reserve(rcpt string) (uint64, func(), error) {
	if r.ctx.Err() != nil {
		return 0, nil, ErrClosed
	}
	st, err := r.lockStream(rcpt)
	if err != nil {
		return 0, nil, err
	}
	seq, err := r.store.ReserveSequence()
	var lower []uint64
	if err == nil {
		lower = r.sendsStoring(st, seq)
		st.storing = append(st.storing, seq)
		r.replaying.Store(seq, struct{}{})
	}
	st.mu.Unlock()
	if err != nil {
		return 0, nil, err
	}
	done := func() {
		r.replaying.Delete(seq)
		r.doneStoring(st, seq)
	}
	if !r.waitStored(st, lower) {
		// Closing: the sends waited for may still commit after the
		// replay would, which must not take a sequence above theirs.
		done()
		return 0, nil, ErrClosed
	}
	return seq, done, nil
}

// sendsStoring returns the sequences below seq that st's sends are storing
// (not another Replay's). Caller holds st.mu.
func (r *Relay) sendsStoring(st *stream, seq uint64) []uint64 {
	var lower []uint64
	for _, q := range st.storing {
		if _, replay := r.replaying.Load(q); q < seq && !replay {
			lower = append(lower, q)
		}
	}
	return lower
}

// waitStored returns once none of lower is in st's storing list any more:
// the messages sends reserved them for are committed (or failed). A Replay
// waits for them before its own commit, since an OVERWRITE version stored
// under one of them is newer than the dead letter it replays, and the
// coalesce index, which the replay's commit checks, learns of it only with
// its commit: the replay would otherwise take the older version back above
// it, and the newer one, committed after, would be dropped as superseded.
// Another Replay's reservations are not waited for (two replays would wait
// for each other); a dead-lettered version is in the index already.
//
// It reports false when the relay closed first.
func (r *Relay) waitStored(st *stream, lower []uint64) bool {
	if len(lower) == 0 {
		return true
	}
	r.reserveWaiting.Add(1)
	defer r.reserveWaiting.Add(-1)
	for {
		r.storedMu.Lock()
		wake := r.storedWake
		r.storedMu.Unlock()
		st.mu.Lock()
		pending := slices.ContainsFunc(lower, func(q uint64) bool { return slices.Contains(st.storing, q) })
		st.mu.Unlock()
		if !pending {
			return true
		}
		select {
		case <-wake:
		case <-r.ctx.Done():
			return false
		}
	}
}

// doneStoring removes seq from st's storing list and wakes the relay.
func (r *Relay) doneStoring(st *stream, seq uint64) {
	st.mu.Lock()
	st.storing = removeSeq(st.storing, seq)
	r.storedLocked(st)
}

// doneStoringRun is doneStoring for a run of st's commits at once, with
// one wake-up. A pipelining producer keeps thousands of sequences storing
// and they commit in the list's order: taking them off one by one moved
// the rest of the list for every message. Each stretch of the run that
// lies side by side in the list leaves it in one move.
func (r *Relay) doneStoringRun(st *stream, run []storedSeq) {
	st.mu.Lock()
	list := st.storing
	for len(run) > 0 {
		i := slices.Index(list, run[0].seq)
		if i < 0 {
			run = run[1:]
			continue
		}
		k := 1
		for k < len(run) && i+k < len(list) && list[i+k] == run[k].seq {
			k++
		}
		list = slices.Delete(list, i, i+k)
		run = run[k:]
	}
	st.storing = list
	r.storedLocked(st)
}

// removeSeq removes seq from list, if it is there.
func removeSeq(list []uint64, seq uint64) []uint64 {
	if i := slices.Index(list, seq); i >= 0 {
		return slices.Delete(list, i, i+1)
	}
	return list
}

// storedLocked ends doneStoring: st's storing list changed. It unlocks
// st.mu, which the caller holds.
func (r *Relay) storedLocked(st *stream) {
	st.waitStoring = false
	st.updateBlocked(r.cfg.MaxAckPending)
	st.mu.Unlock()
	r.Notify(st.rcpt)
	if r.reserveWaiting.Load() > 0 {
		r.storedMu.Lock()
		close(r.storedWake)
		r.storedWake = make(chan struct{})
		r.storedMu.Unlock()
	}
}

// wire returns the envelope of sm as it goes on the wire in one emission:
// a fresh msg id, its attempt number, its predecessor in the emission, the
// stream's epoch and the TTL it has left.
func (r *Relay) wire(sm *pb.StoredMessage, prev, epoch uint64, nowMs int64) *pb.Envelope {
	e := sm.GetEnvelope()
	w := &pb.Envelope{}
	*w = pb.Envelope{
		ProtocolVersion: pb.ProtocolVersion,
		MsgId:           mailbox.NewID(),
		IdempotencyKey:  e.GetIdempotencyKey(),
		Sender:          e.GetSender(),
		Recipient:       e.GetRecipient(),
		CreatedAtUnixMs: e.GetCreatedAtUnixMs(),
		Type:            e.GetType(),
		Headers:         e.GetHeaders(),
		Body:            e.GetBody(),
		Rpc:             e.GetRpc(),
		EventSeq:        e.GetEventSeq(),
		Sequence:        e.GetSequence(),
		Conflict:        e.GetConflict(),
		Attempt:         sm.GetAttempts() + 1,
		Receipt:         pb.Envelope_RECEIPT_PROCESSED,
		PrevSequence:    prev,
		StreamEpoch:     epoch,
		CoalesceKey:     e.GetCoalesceKey(),
	}
	if ttl := e.GetTtlMs(); ttl > 0 {
		w.TtlMs = max(sm.GetCreatedElapsedMs()+ttl-nowMs, 1)
	}
	return w
}

// newEpoch starts a new epoch of st: its sender state went back (a restored
// backup), so the receiver's watermark for the old epoch says nothing about
// what this sender has. A random epoch, not the next one: the lost history
// may have used the next one too.
func (r *Relay) newEpoch(st *stream) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	epoch := binary.BigEndian.Uint64(b[:]) | 1
	if err := r.store.SetEpoch(st.rcpt, epoch); err != nil {
		r.cfg.Logger.Warn("relay: new epoch not stored; resending in the old one", "recipient", st.rcpt, "err", err)
		r.unrecorded(st) // at once, it would meet the same answer and the same disk
		return
	}
	st.mu.Lock()
	st.epoch, st.proven = epoch, false
	st.mu.Unlock()
	r.restores.Add(1)
	r.cfg.Logger.Warn("relay: the receiver has seen sequences this outbox never sent, or other messages under them: its state went back (restored from a backup?); starting a new epoch of the stream",
		"recipient", st.rcpt, "epoch", epoch)
}

// dispatch starts an emission of rcpt if its peer is alive, the stream can
// send and its limiter has room. It reports whether one started.
func (r *Relay) dispatch(p *part, rcpt string, nowMs int64) bool {
	node := address.Node(rcpt)
	if !r.d.Alive(node) {
		// The peer is down: deferred, never counted. NodeAlive wakes it,
		// DownRecheck is the safety net.
		r.deferDown(rcpt, node)
		return false
	}
	st, err := r.lockStream(rcpt)
	if err != nil {
		r.cfg.Logger.Warn("relay: stream state", "recipient", rcpt, "err", err)
		return false
	}
	defer st.mu.Unlock()
	lim := r.Limiter(node)
	if st.direct || st.sending || st.ackBatches >= r.cfg.MaxAckPending || st.waitStoring {
		return false
	}
	// Only what of st.acking is still queued is skipped: an Ack that
	// committed a moment ago, or one that failed and whose message a newer
	// version of its coalesce key (or an operator) took out meanwhile,
	// would otherwise count twice and hold back what is queued behind it.
	n := r.emissionSize(r.store.PendingExcept(rcpt, st.acking))
	if n <= 0 {
		return false
	}
	if st.room > 0 {
		// The receiver said how much its mailbox takes: at least one, to
		// hear again.
		n = min(n, max(int(st.room)-1, 1))
	}
	g := lim.TryAcquire(n)
	if g == 0 {
		return false
	}
	if lim.InFlight() >= lim.Limit() {
		r.exclude(node, lim) // full now: later scans skip the whole node
	}
	st.sending = true
	st.updateBlocked(r.cfg.MaxAckPending)
	req := outbox.HeadRequest{Recipient: rcpt, Max: g, MaxBytes: r.cfg.BatchBytes, Skip: slices.Clone(st.acking), EmittedHW: st.emittedHW}
	if len(st.storing) > 0 {
		req.Below = st.storing[0]
	}
	r.wg.Add(1)
	go r.deliver(st, lim, g, req)
	return true
}

// emission is one Deliver call of a stream: its messages, their envelopes
// as sent, and, once done is closed, its receipts.
type emission struct {
	msgs  []*pb.StoredMessage
	envs  []*pb.Envelope
	seen  uint64 // the stream's emitted high-water before it
	slots int    // the peer's AIMD slots it holds until released
	// queued is closed once the Deliverer has queued it on its path
	// (internal/queued), if it says so; done once Deliver returned.
	queued, done chan struct{}

	receipts []*pb.Receipt // valid once done is closed
	err      error
}

// heard records in st.room the room the receiver said in rc, the last
// receipt the stream read. A receipt that says nothing (through a
// forwarder, which does not carry the room; from an older receiver)
// forgets what was said before: a room said once, when the receiver was
// momentarily full, must not bound the stream for the rest of its
// backlog.
func (r *Relay) heard(st *stream, rc *pb.Receipt) {
	var stored uint16
	if room, said := roomIn(rc); said {
		stored = uint16(min(room, math.MaxUint16-1) + 1)
	}
	st.mu.Lock()
	st.room = stored
	st.mu.Unlock()
}

// maxRetryHint bounds the wait a receipt's retry_after_ms asks for. It is
// the receiver's word: a hint of years would park the stream (its deferral
// is stored) long after the receiver has room, and one past 2^63 ns would
// wrap negative. A receiver that still has no room says so again.
const maxRetryHint = time.Minute

// retryHint is a receipt's retry_after_ms as a wait: 0 for none (or a
// negative one), at most maxRetryHint.
func retryHint(ms int64) time.Duration {
	if ms <= 0 {
		return 0
	}
	return time.Duration(min(ms, maxRetryHint.Milliseconds())) * time.Millisecond
}

// roomIn is the room rc says the receiver's mailbox had; said is false
// when rc says nothing of it (an older receiver, a forwarder's receipt).
// A room past what an int holds (32 bits on some platforms) is as good as
// the most it holds.
func roomIn(rc *pb.Receipt) (room int, said bool) {
	return int(min(uint64(rc.GetRoom()), math.MaxInt)), rc.GetRoom() != 0 || rc.GetArrived() != 0
}

// worthEarly is n as the size of an emission sent early: 0 under an
// eighth of BatchSize, which is not worth one.
func (r *Relay) worthEarly(n int) int {
	if n < max(1, r.cfg.BatchSize/8) {
		return 0
	}
	return n
}

// firstEarly is the size of the emission sent behind cur, a stream's
// emission from the frontier, before any of its receipts: what the
// receiver last said its mailbox could take (said; negative: it said
// nothing), less cur, which has not arrived; at most half of BatchSize
// (drainSize, also when it said nothing); 0 under an eighth of BatchSize.
func (r *Relay) firstEarly(said int, cur *emission) int {
	if said < 0 {
		return r.drainSize()
	}
	return r.worthEarly(min(said-len(cur.envs), r.drainSize()))
}

// lastReceipt is the last of e's receipts (nil: none). Valid once done is
// closed.
func (e *emission) lastReceipt() *pb.Receipt {
	if len(e.receipts) == 0 {
		return nil
	}
	return e.receipts[len(e.receipts)-1]
}

// top is the highest sequence of e.
func (e *emission) top() uint64 { return e.envs[len(e.envs)-1].GetSequence() }

// emissionSize is how many of n queued messages one emission takes: all of
// them up to BatchSize, and half of BatchSize when more are queued (a
// drain), so that the stream's next emission can go while this one awaits
// its receipts (follow) and the two hold no more of the receiver's mailbox
// than one full emission would.
//
// Only a Deliverer that says when it queued an emission (internal/queued)
// lets follow send early; until one has, emissions take BatchSize.
func (r *Relay) emissionSize(n int) int {
	if n > r.cfg.BatchSize && r.queues.Load() {
		return (r.cfg.BatchSize + 1) / 2
	}
	return min(n, r.cfg.BatchSize)
}

// drainSize is the size of an emission while more waits behind it.
func (r *Relay) drainSize() int { return r.emissionSize(r.cfg.BatchSize + 1) }

// earlySize is the size of the emission to send while next awaits its
// receipts. rc is the last receipt of the emission before next (top: its
// highest sequence): the room the receiver's mailbox had as rc was
// written, and the highest sequence of the stream that had reached it by
// then. What of next had not is on its way and takes its share of that
// room, so the emission never takes more than the mailbox has left beside
// next: a receiver, however slow or far, is not overrun by it.
//
// Up to half of most, the largest room the receiver said in this run of
// the stream (as near its mailbox's size as the sender can tell), and at
// least half of BatchSize: a mailbox of one batch then takes two halves
// in turn (one full emission would leave no room for the next, and the
// stream would alternate between a full emission and none), one of two
// batches or more takes two full ones, which over a long link carries
// twice as much per round trip. Up to BatchSize; 0 when less than an
// eighth of it would fit: nothing goes early, and the stream's next
// emission waits for next's receipts.
//
// Not counted: what the receiver takes while an emission travels. A
// sender cannot measure it (its receipts show the pace it was sent at, or
// come bunched from a batch actor), and every bet on it overran busy and
// idle receivers alike; a long link gains by a larger mailbox instead.
//
// A receiver that does not say its room (an older one) gets half of
// BatchSize (drainSize), which keeps two emissions in flight to what one
// full one would be.
func (r *Relay) earlySize(rc *pb.Receipt, top uint64, next *emission, most int) int {
	room, said := roomIn(rc)
	if !said {
		return r.drainSize()
	}
	i, _ := slices.BinarySearchFunc(next.envs, max(rc.GetArrived(), top)+1, func(e *pb.Envelope, seq uint64) int {
		return cmp.Compare(e.GetSequence(), seq)
	})
	return r.worthEarly(min(room-(len(next.envs)-i), max(r.drainSize(), most/2), r.cfg.BatchSize))
}

// send builds the envelopes of msgs, the stream's next emission after the
// sequence prev (0: from the frontier), raises the stream's emitted
// high-water, starts reading the emission after it (up to ahead messages)
// and puts it on the wire. Caller holds st.mu.
func (r *Relay) send(st *stream, req outbox.HeadRequest, msgs []*pb.StoredMessage, prev uint64, slots, ahead int) *emission {
	e := &emission{msgs: msgs, envs: make([]*pb.Envelope, len(msgs)), seen: st.emittedHW, slots: slots,
		queued: make(chan struct{}), done: make(chan struct{})}
	nowMs := r.store.ElapsedMs()
	for i, m := range msgs {
		e.envs[i] = r.wire(m, prev, st.epoch, nowMs)
		prev = e.envs[i].GetSequence()
	}
	st.emittedHW = max(st.emittedHW, prev)
	r.batches.Add(1)
	r.readAhead(st, req, msgs, st.emittedHW, aheadBelow(st, req, r.store.HandedOutBelow()), ahead)
	r.wg.Go(func() {
		defer close(e.done)
		dctx, cancel := context.WithTimeout(r.ctx, r.cfg.DeliverTimeout)
		defer cancel()
		var once sync.Once
		dctx = queued.With(dctx, func() {
			once.Do(func() {
				r.queues.Store(true)
				close(e.queued)
			})
		})
		var via string
		e.receipts, via, e.err = r.routes.deliver(dctx, st.node, e.envs)
		r.markStrays(st.rcpt, via, e.envs, e.receipts)
	})
	return e
}

// follow sends st's next emission while cur awaits its receipts, when it
// was read ahead before they came (ahead.go) and a Head would return it
// first if every receipt of cur comes back positive: chained to cur's last
// message, it runs at the receiver only after all of cur did, so if cur is
// not clean its messages are refused, and its receipts are not read (they
// are lost, as far as the stream knows: its messages stay queued and go
// again from the frontier). It takes up to size messages (0: none). It
// returns nil when it sent nothing.
func (r *Relay) follow(st *stream, lim *Limiter, cur *emission, size int) (early *emission) {
	if r.onFollow != nil {
		defer func() { r.onFollow(cur.top(), early != nil) }()
	}
	if size == 0 {
		return nil
	}
	r.ahead.mu.Lock()
	a := r.ahead.m[st]
	r.ahead.mu.Unlock()
	if a == nil {
		return nil
	}
	select {
	case <-a.done:
	case <-cur.done:
		return nil // settled first: the next emission reads it with head
	}
	select {
	case <-cur.queued:
		// Queued behind cur on the same path: the receiver takes it
		// after cur.
	case <-cur.done:
		return nil // not queued as far as anyone said
	}
	if r.ctx.Err() != nil || !r.d.Alive(st.node) || r.routes.forwarding(st.node) {
		// Through a forwarder, two emissions may overtake each other.
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.proven || st.ackBatches >= r.cfg.MaxAckPending {
		return nil
	}
	req := outbox.HeadRequest{Recipient: st.rcpt, Max: size, MaxBytes: r.cfg.BatchBytes,
		Skip: mergeSorted(st.acking, sequences(cur.msgs)), EmittedHW: st.emittedHW}
	if len(st.storing) > 0 {
		req.Below = st.storing[0]
	}
	msgs := r.usable(a, req)
	if msgs == nil || msgs[0].GetEnvelope().GetSequence() <= cur.top() {
		r.dropAhead(st) // a Head now would differ: so would one after cur
		return nil
	}
	g := lim.TryAcquire(len(msgs))
	if g == 0 {
		return nil // the read stays for head
	}
	if lim.InFlight() >= lim.Limit() {
		r.exclude(st.node, lim)
	}
	r.dropAhead(st)
	r.ahead.used.Add(1)
	r.pipelined.Add(1)
	req.Max = g
	return r.send(st, req, msgs[:g], cur.top(), g, size)
}

// deliver makes one emission of st, and the emissions that follow it while
// each awaits its receipts, and applies their receipts in order.
//
// Pipelining: when every receipt is positive, the stream may start its
// next emission before this one's Ack has committed; the acked sequences
// stay in st.acking (skipped by Head) until the commit, or, if it fails,
// until the sweeper's retry commits (ackretry.go). After any
// other outcome the stream stays busy until the verdict and the acks are
// recorded, and the emission that followed it has come back, so the next
// emission starts at the frontier.
func (r *Relay) deliver(st *stream, lim *Limiter, slots int, req outbox.HeadRequest) {
	defer r.wg.Done()
	sending := true
	// next is the emission sent early, not yet settled: the stream is
	// free only once it came back.
	var next *emission
	release := func(e *emission) {
		if e.slots > 0 {
			r.release(st.node, lim, e.slots)
			e.slots = 0
		}
	}
	defer func() {
		if next != nil {
			<-next.done
			release(next)
		}
		if slots > 0 {
			r.release(st.node, lim, slots) // nothing was sent
		}
		if sending {
			st.mu.Lock()
			st.sending = false
			st.updateBlocked(r.cfg.MaxAckPending)
			st.mu.Unlock()
		}
		r.forget(st)
		// Slots of the node were released: any partition may have
		// recipients of it waiting.
		r.wakeAll()
	}()
	msgs, waitUntil, err := r.head(st, req)
	if err != nil {
		if r.ctx.Err() == nil {
			// Head writes too (it gives up what ran out of TTL or age): a
			// disk that refuses would make the stream due again at once.
			r.cfg.Logger.Warn("relay: head failed", "recipient", st.rcpt, "err", err)
			r.unrecorded(st)
		}
		return
	}
	if len(msgs) == 0 {
		switch {
		case waitUntil > 0:
			// The head ran out of TTL after it was sent: it can be neither
			// sent nor given up before waitUntil; the stream waits with it.
			r.store.Defer(st.rcpt, waitUntil)
		case req.Below != 0:
			// Everything queued is above a sequence still committing: wait
			// for its doneStoring, unless it came while Head ran.
			st.mu.Lock()
			if len(st.storing) > 0 && st.storing[0] <= req.Below {
				st.waitStoring = true
			}
			st.mu.Unlock()
		}
		return
	}
	st.mu.Lock()
	cur := r.send(st, req, msgs, 0, slots, r.drainSize())
	said := int(st.room) - 1
	st.mu.Unlock()
	slots = 0
	next = r.follow(st, lim, cur, r.firstEarly(said, cur))
	most := max(said, 0) // the largest room the receiver said
	for {
		<-cur.done
		r.heard(st, cur.lastReceipt())
		// The peer's share of the work is over when the receipts are back:
		// free its AIMD slots now so other recipients of the node need not
		// wait for this emission's ack fsync.
		release(cur)
		r.wakeAll()
		derr := cur.err
		if r.ctx.Err() != nil {
			// Closing: the messages stay queued and are sent again later;
			// acks of positive receipts are still recorded.
			derr = fmt.Errorf("partition: relay closing: %w", r.ctx.Err())
		}
		// The receiver may have run some of next before it answered cur:
		// a watermark of next's is one this stream set. Only a proven
		// stream sends next early (follow), and its watermarks are all
		// its own: a restore would have shown in its first emission.
		onWire := cur.envs
		if next != nil {
			onWire = slices.Concat(cur.envs, next.envs)
		}
		acks, clean := r.process(st, cur.envs, cur.receipts, derr, cur.seen, onWire)
		var after *emission
		switch {
		case !clean:
			r.dropAhead(st) // the next emission starts at the frontier
		case next == nil:
			// Every receipt positive: let the next emission go while
			// this Ack waits for its fsync.
			sending = false
			r.acking(st, acks, true)
		default:
			// The one after next goes before this Ack's fsync.
			r.acking(st, acks, false)
			rc := cur.lastReceipt()
			if room, said := roomIn(rc); said {
				most = max(most, room)
			}
			after = r.follow(st, lim, next, r.earlySize(rc, cur.top(), next, most))
		}
		if len(acks) > 0 {
			r.settle(st, acks, clean)
		}
		if !clean || next == nil {
			// Whatever followed cur is waited for (by the deferred
			// release) before the stream is free again; its receipts
			// are not read.
			return
		}
		cur, next = next, after
	}
}

// acking lists the acks of a clean emission as committing: its next
// emission may skip them. free says the stream may start its next emission
// now.
func (r *Relay) acking(st *stream, acks []uint64, free bool) {
	st.mu.Lock()
	if free {
		st.sending = false
	}
	st.proven = true
	st.ackBatches++
	st.acking = mergeSorted(st.acking, acks)
	st.updateBlocked(r.cfg.MaxAckPending)
	st.mu.Unlock()
	if free {
		r.Notify(st.rcpt)
	}
}

// settle commits the acks of a settled emission; clean says acking listed
// them already.
func (r *Relay) settle(st *stream, acks []uint64, clean bool) {
	err := r.ack(st.rcpt, acks)
	if err != nil {
		// The receiver ran them; only the record of it failed. They stay
		// skipped (st.acking), neither sent again nor given up by the
		// sweeper, which retries the Ack.
		if !clean {
			st.mu.Lock()
			st.ackBatches++
			st.acking = mergeSorted(st.acking, acks)
			st.updateBlocked(r.cfg.MaxAckPending)
			st.mu.Unlock()
		}
		r.ackLater(st, acks, err)
		return
	}
	if clean {
		r.acked(st, acks)
		return
	}
	r.delivered.Add(uint64(len(acks)))
}

// process applies the receipts of one emission in order and returns the
// sequences to ack; clean reports that every message came back positive.
// The first non-positive outcome decides what happens next; messages after
// it that did not come back positive stay queued, uncounted.
//
// onWire lists, ascending, what the stream has on the wire: envs, and the
// emission sent after it, if any.
func (r *Relay) process(st *stream, envs []*pb.Envelope, receipts []*pb.Receipt, derr error, seen uint64, onWire []*pb.Envelope) (acks []uint64, clean bool) {
	decided, congested := false, false
	defer func() {
		if congested {
			// One congestion event per emission, however many of its
			// messages were refused: the limit halves once.
			r.Limiter(st.node).OnCapacity()
		}
	}()
	if slices.ContainsFunc(receipts, func(rc *pb.Receipt) bool { return rc.GetCode() == pb.Receipt_DIVERGED }) ||
		r.otherAtWatermark(st, onWire, receipts) {
		// The receiver holds other messages under this stream's sequences
		// than this sender sent: the emission's DUPLICATEs speak of a
		// history this sender no longer has, and its messages must go
		// again in a new epoch. Only what ran (PROCESSED) is acked.
		for i, rc := range receipts {
			if rc.GetCode() == pb.Receipt_PROCESSED && i < len(envs) {
				acks = append(acks, envs[i].GetSequence())
			}
		}
		r.failed.Add(1)
		r.newEpoch(st)
		return acks, false
	}
	for i, e := range envs {
		var rc *pb.Receipt
		if i < len(receipts) {
			rc = receipts[i]
		}
		v := r.judge(st, e, rc, derr, i, seen, onWire)
		congested = congested || v.capacity
		if v.kind == vPositive {
			acks = append(acks, e.GetSequence())
			continue
		}
		if v.kind == vRestored {
			// Nothing more of this emission is acked: its DUPLICATEs speak
			// of a history this sender no longer has.
			r.failed.Add(1)
			r.newEpoch(st)
			return acks, false
		}
		if decided {
			continue
		}
		decided = true
		r.failed.Add(1)
		r.apply(st, v, e.GetSequence(), true, 0)
	}
	if len(onWire) == len(envs) {
		st.unsent(seen, envs, receipts) // nothing was sent after envs
	}
	return acks, !decided && derr == nil
}

// otherAtWatermark reports that a receipt of the emission gives the
// digest of the message the receiver ran at its watermark
// (watermark_digest) and this stream holds another message under that
// sequence: the sequences went back (the outbox was restored from a
// backup), and the receipts' DUPLICATEs speak of messages this sender no
// longer has. The watermark by itself (wentBack) shows a restore only when
// it lies above, or between, what the stream counts as sent; this works
// from the message the stream holds there, so an emission that stops
// below the watermark (kept small by the receiver's room, or after a
// restart that counted everything stored as sent) gives it away too, and
// so does an emission whose message at the watermark got no answer that
// compared it (refused for room, dropped, not yet decided). The message is
// looked for in what is on the wire, then in the store: an honest
// stream's message at the watermark is the one that ran, or gone (acked,
// replaced by a newer version, given up), and a sequence is never another
// stream's.
func (r *Relay) otherAtWatermark(st *stream, onWire []*pb.Envelope, receipts []*pb.Receipt) bool {
	var checked uint64
	for _, rc := range receipts {
		w, d := rc.GetWatermark(), rc.GetWatermarkDigest()
		if d == 0 || w == 0 || w == checked {
			continue
		}
		checked = w
		if i, found := slices.BinarySearchFunc(onWire, w, func(e *pb.Envelope, w uint64) int { return cmp.Compare(e.GetSequence(), w) }); found {
			if pb.StreamDigest(onWire[i]) != d {
				return true
			}
			continue
		}
		sm, err := r.store.Stored(w)
		if err != nil || sm == nil {
			continue // nothing to compare: what the watermark says by itself still counts (judge)
		}
		if sm.GetEnvelope().GetRecipient() != st.rcpt || pb.StreamDigest(sm.GetEnvelope()) != d {
			// Another message of this stream, or one of another stream:
			// a sequence is handed out once per outbox, so the receiver's
			// watermark, a sequence this stream sent it, is another
			// recipient's only in an outbox that handed it out again.
			return true
		}
	}
	return false
}

// unsent lowers st's emitted high-water, raised to the top of envs by
// their emission (the last the stream sent, above seen), to the highest
// of them that may have run. A message whose receipt says it did not run
// (notRun) left no copy that could: for what the receiver's watermark may
// be, and for its TTL, it was never on the wire. So a restored sender
// whose first emission was refused (its actor not back yet) still finds
// out from the next one, whose seen would otherwise cover the sequences
// the receiver ran before the restore.
func (st *stream) unsent(seen uint64, envs []*pb.Envelope, receipts []*pb.Receipt) {
	ran := seen
	for i, e := range envs {
		if i >= len(receipts) || !notRun(receipts[i]) {
			ran = max(ran, e.GetSequence())
		}
	}
	st.mu.Lock()
	if top := envs[len(envs)-1].GetSequence(); st.emittedHW == max(seen, top) {
		st.emittedHW = ran
	}
	st.mu.Unlock()
}

// notRun reports that rc says its message did not run, and that this
// delivery of it never will: no such actor (or it was stopping), out of
// order, or expired before its handler. Not CAPACITY: a receiver whose
// disk refused the watermark of a message that ran answers it CAPACITY
// too (the sender waits, uncounted), so CAPACITY proves nothing.
func notRun(rc *pb.Receipt) bool {
	switch rc.GetCode() {
	case pb.Receipt_NO_SUCH_ACTOR, pb.Receipt_OUT_OF_ORDER, pb.Receipt_EXPIRED:
		return true
	}
	return false
}

type verdictKind int

const (
	vPositive verdictKind = iota + 1 // PROCESSED or DUPLICATE: ack
	vRestored                        // the receiver has seen more than this sender sent: new epoch
	vPoison                          // REJECTED or unsendable: dead-letter
	vExpired                         // EXPIRED or FORGOTTEN: dead-letter as expired
	vCounted                         // a handler failure: counts toward MaxAttempts
	vDefer                           // nobody's fault: wait (retry after at least retryAfter)
	vResend                          // OUT_OF_ORDER: send again from the frontier at once
	vDown                            // the peer went down: wait for it
	vClosing                         // the relay is closing: nothing to record
)

type verdict struct {
	kind       verdictKind
	reason     string
	retryAfter time.Duration
	capacity   bool // the peer (or the local send queue) is full: AIMD halves, once per emission
}

// judge turns the outcome of one message of an emission (index i of sent,
// ascending) into a verdict, and feeds the peer's limiter its successes
// (the caller halves it, once per emission, on a verdict marked
// capacity). seen is the stream's emitted high-water before the emission.
//
// Only the receiver's verdict on the message itself counts toward
// MaxAttempts: a handler failure, or NO_SUCH_ACTOR from a node past its
// spawn grace. Everything that is the network's or the sender's doing (a
// lost receipt, a reset connection, a full send queue, the peer full or
// down, an OUT_OF_ORDER refusal, another message of the emission failing)
// is deferred, never counted; so a healthy message never reaches the
// dead-letter queue.
func (r *Relay) judge(st *stream, e *pb.Envelope, rc *pb.Receipt, derr error, i int, seen uint64, sent []*pb.Envelope) verdict {
	lim := r.Limiter(st.node)
	var un *UnsendableError
	if errors.As(derr, &un) {
		if uerr, ok := un.Errs[i]; ok {
			if errors.Is(uerr, ErrNotYet) {
				return verdict{kind: vDefer, reason: uerr.Error()}
			}
			return verdict{kind: vPoison, reason: "rejected: cannot be sent: " + uerr.Error() + r.sentNote(st.rcpt, e.GetSequence(), seen)}
		}
	}
	if rc == nil {
		switch {
		case r.ctx.Err() != nil:
			return verdict{kind: vClosing}
		case errors.Is(derr, ErrCongested):
			var ce *CongestedError
			var ra time.Duration
			if errors.As(derr, &ce) {
				ra = ce.RetryAfter
			}
			return verdict{kind: vDefer, reason: "local send queue full", capacity: true, retryAfter: ra}
		case !r.d.Alive(st.node):
			return verdict{kind: vDown}
		}
		reason := "no receipt"
		if derr != nil {
			reason = "no receipt: " + derr.Error()
		}
		return verdict{kind: vDefer, reason: reason}
	}
	// A watermark this stream never sent (above everything it emitted,
	// this emission included, or between two of this emission's messages
	// and none of them) means the sender's state went back. This emission
	// counts: a DUPLICATE receipt waits for a durable watermark, which may
	// already cover later messages of the same emission.
	restored := func() bool { return wentBack(rc.GetWatermark(), seen, sent) }
	ra := retryHint(rc.GetRetryAfterMs())
	switch rc.GetCode() {
	case pb.Receipt_PROCESSED:
		if restored() {
			// The receiver's handler had applied this sequence for
			// another message (it records what it applied, and skipped
			// this one as a copy): this sender's sequences went back.
			return verdict{kind: vRestored}
		}
		lim.OnSuccess()
		st.resetDeferrals()
		return verdict{kind: vPositive}
	case pb.Receipt_DUPLICATE:
		if restored() {
			return verdict{kind: vRestored}
		}
		lim.OnSuccess()
		st.resetDeferrals()
		return verdict{kind: vPositive}
	case pb.Receipt_OUT_OF_ORDER:
		r.outOfOrder.Add(1)
		if restored() {
			return verdict{kind: vRestored}
		}
		return verdict{kind: vResend, reason: "out of order"}
	case pb.Receipt_DIVERGED:
		// The receiver ran another message under this sequence (or under
		// one before it in this emission): this sender's sequences went
		// back.
		return verdict{kind: vRestored}
	case pb.Receipt_FORGOTTEN:
		if e.GetSequence() > seen {
			// Never on the wire before, so it never ran: the receiver's
			// horizon is above it only because this outbox's sequences
			// went back (a restored backup). A new epoch has no horizon.
			return verdict{kind: vRestored}
		}
		// It may have run before the receiver forgot its stream: sending
		// it again could run it twice. Its age was undercounted here (this
		// node was down longer than its clock could count).
		return verdict{kind: vExpired, reason: outbox.ReasonForgotten}
	case pb.Receipt_CAPACITY:
		if rc.GetWatermark() != 0 && restored() {
			// Refused for room before it ran, with the stream's
			// watermark: one this sender never sent.
			return verdict{kind: vRestored}
		}
		return verdict{kind: vDefer, reason: "capacity: " + rc.GetMessage(), retryAfter: max(ra, 10*time.Millisecond), capacity: true}
	case pb.Receipt_EXPIRED:
		if r.mayStray(st.rcpt, e.GetSequence()) {
			// This copy expired, but one sent earlier through a forwarder
			// may still reach the recipient and run (its TTL counted from
			// its own arrival): not "never ran".
			return verdict{kind: vExpired, reason: outbox.ReasonExpiredUnknown}
		}
		return verdict{kind: vExpired, reason: outbox.ReasonExpired}
	case pb.Receipt_REJECTED:
		return verdict{kind: vPoison, reason: "rejected: " + rc.GetMessage() + r.strayNote(st.rcpt, e.GetSequence())}
	case pb.Receipt_NO_SUCH_ACTOR:
		if ra > 0 {
			// The node is within its spawn grace: the actor may come.
			return verdict{kind: vDefer, reason: "no such actor yet: " + rc.GetMessage(), retryAfter: ra}
		}
		return verdict{kind: vCounted, reason: "no such actor: " + rc.GetMessage() + r.sentNote(st.rcpt, e.GetSequence(), seen)}
	case pb.Receipt_TRANSIENT:
		return verdict{kind: vCounted, reason: rc.GetMessage() + r.strayNote(st.rcpt, e.GetSequence())}
	}
	// ACCEPTED or a code this build does not know proves nothing about the
	// handler: wait and send again, uncounted.
	return verdict{kind: vDefer, reason: "unexpected receipt " + rc.GetCode().String()}
}

// wentBack reports that a receiver's watermark w shows this stream's
// sequences went back (a restored backup): w is above everything the stream
// emitted (seen, its high-water before the emission sent, and sent), or it
// lies between two messages of sent, above seen, and is none of them. A
// receiver's watermark is a sequence this stream sent, unless the sender's
// state went back: sent before this emission, it is at most seen, or, when
// the high-water was dropped with an emptied queue, below every message
// queued since (new sequences are above all handed out); otherwise it is in
// sent. A restored sender that gave w to another recipient's message
// (sequences belong to the whole outbox) sends an emission that straddles
// w: its messages below w are answered DUPLICATE as copies, but are new.
func wentBack(w, seen uint64, sent []*pb.Envelope) bool {
	if len(sent) == 0 {
		return w > seen
	}
	first, top := sent[0].GetSequence(), sent[len(sent)-1].GetSequence()
	if w > max(seen, top) {
		return true
	}
	if w <= seen || w <= first || w >= top {
		return false
	}
	_, found := slices.BinarySearchFunc(sent, w, func(e *pb.Envelope, w uint64) int { return cmp.Compare(e.GetSequence(), w) })
	return !found
}

func (st *stream) resetDeferrals() {
	st.mu.Lock()
	st.deferrals = 0
	st.mu.Unlock()
}

// apply records a non-positive verdict on message seq and schedules the
// stream's next emission. record says the verdict still has to be written
// to the store (a relay emission); a direct attempt's message was stored
// with it already (attempts is then its stored count).
func (r *Relay) apply(st *stream, v verdict, seq uint64, record bool, attempts int) {
	switch v.kind {
	case vClosing:
	case vDown:
		r.deferDown(st.rcpt, st.node)
	case vResend:
		r.Notify(st.rcpt) // from the frontier, at once
	case vDefer:
		st.mu.Lock()
		first := st.deferrals == 0
		st.deferrals++
		n := int(st.deferrals)
		st.mu.Unlock()
		if first && v.retryAfter > 0 {
			// The first deferral since the stream last made progress
			// trusts the receiver's own hint (a full mailbox estimates when
			// it has room); the AIMD limit has already halved. Only
			// deferrals without progress in between back off further.
			r.deferFor(st.rcpt, v.retryAfter)
			return
		}
		r.deferFor(st.rcpt, max(v.retryAfter, r.cfg.Backoff.Delay(n)))
	case vPoison:
		if record {
			if _, _, ok := r.fail(st.rcpt, seq, outbox.Failure{Reason: v.reason, Permanent: true}); !ok {
				r.unrecorded(st)
			}
		}
	case vExpired:
		if record {
			if _, err := r.store.Expire(st.rcpt, []uint64{seq}, v.reason); err != nil {
				if r.ctx.Err() == nil {
					r.cfg.Logger.Warn("relay: recording an expiry", "recipient", st.rcpt, "seq", seq, "err", err)
				}
				r.unrecorded(st)
			}
		}
	case vCounted:
		if record {
			n, dead, ok := r.fail(st.rcpt, seq, outbox.Failure{Reason: v.reason, Counts: true})
			if !ok {
				r.unrecorded(st)
				return
			}
			if dead {
				return
			}
			attempts = n
		}
		r.deferFor(st.rcpt, r.cfg.Backoff.Delay(attempts))
	}
}

// unrecorded defers st after a verdict the store could not record (its
// disk refused the commit): the message is still at the head of its
// queue, and sending it again at once would run it again, as fast as the
// peer answers, for as long as the disk refuses. The delay grows while it
// lasts, as deferrals without progress do.
func (r *Relay) unrecorded(st *stream) {
	st.mu.Lock()
	st.deferrals++
	n := int(st.deferrals)
	st.mu.Unlock()
	r.deferFor(st.rcpt, r.cfg.Backoff.Delay(n))
}

// fail records a verdict in the store; ok is false when it could not.
func (r *Relay) fail(rcpt string, seq uint64, f outbox.Failure) (attempts int, dead, ok bool) {
	attempts, dead, err := r.store.Fail(rcpt, seq, f)
	if err != nil {
		if r.ctx.Err() == nil {
			r.cfg.Logger.Warn("relay: recording a failure", "recipient", rcpt, "seq", seq, "err", err)
		}
		return 0, false, false
	}
	return attempts, dead, true
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

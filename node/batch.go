package node

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// BatchHandler handles several reliable messages of one actor in one call:
// the one-way messages of reliable streams (TellReliable, Dispatch, the
// relay's redeliveries; not a reliable request, which needs a reply of its
// own) that wait in the actor's mailbox, in mailbox order. It exists for
// handlers whose effect has a fixed cost per call, such as a commit with
// an fsync: one commit for many messages.
//
// It returns how many messages, from the first, took effect. As with
// Handler, their effects must be durable when it returns: from then on they
// count as processed, and their senders are told so once the stream
// watermarks covering them are durable. When done < len(msgs), err is the
// failure of msgs[done] (nil means it was not run either) and the messages
// after it must not have been run: they go back to their senders, which send
// them again without counting an attempt. err is classified as a Handler's
// (Permanent dead-letters msgs[done]; a *CapacityError makes the senders
// back off without counting).
//
// A panic re-runs the batch one message at a time, so that only the message
// that panics is dead-lettered; effects of a panicked call that were made
// durable happen twice then, as with a Handler that panics after its
// effect. Server interceptors do not run around a BatchHandler. The
// Messages are valid only during the call.
type BatchHandler func(ctx context.Context, msgs []*Message) (done int, err error)

// WithBatch makes the actor run its reliable one-way messages through h,
// up to max at once (max <= 0: 256); its Handler still runs tell, ask and
// reliable requests.
func WithBatch(h BatchHandler, max int) SpawnOption {
	return func(o *spawnOptions) {
		if max <= 0 {
			max = defaultBatchMax
		}
		o.batch, o.batchMax = h, max
	}
}

// defaultBatchMax bounds a batch when WithBatch is given no maximum: at 128
// B a message, 256 make one commit of ~50 KB, long enough to share the
// fsync widely, short enough that one batch's latency stays a commit's.
const defaultBatchMax = 256

// batchable reports whether d can run in a BatchHandler's batch.
func batchable(d *delivery) bool { return d.receipt != nil && !isRequest(d.env) }

// batchItem is one message of a batch with the stream it holds.
type batchItem struct {
	d    *delivery
	st   *inStream
	keys [][]byte
}

// batch is what handleBatch gathers; owned by the actor's goroutine.
type batch struct {
	items []batchItem
	msgs  []*Message
	// last is, per stream in the batch, the sequence of its last message:
	// the watermark the stream will have if the whole batch succeeds.
	last map[*inStream]uint64
	keys map[string]struct{} // scoped idempotency keys in the batch
	// short: the batch's message has less TTL left than HandlerTimeout, so
	// it bounds the batch's context: it runs alone.
	short bool
}

// handleBatch runs first and the batchable deliveries queued behind it
// through the actor's BatchHandler. It decides each message as
// handleStream does, on this goroutine (the owner of the streams'
// decisions), against the watermark its stream will have if the messages
// before it in the batch succeed. A message whose decision depends on their
// outcome (not the next one of its stream, a repeated idempotency key) ends
// the batch and is decided after it.
func (a *actor) handleBatch(first *delivery) {
	b := &batch{last: make(map[*inStream]uint64), keys: make(map[string]struct{})}
	for d := first; d != nil; {
		d = a.gather(b, d)
		_ = a.runBatch(b)
		clear(b.items)
		clear(b.msgs)
		b.items, b.msgs = b.items[:0], b.msgs[:0]
		clear(b.last)
		clear(b.keys)
	}
}

// gather fills b starting with d; it returns a delivery it took that must
// wait for b's outcome, or nil.
func (a *actor) gather(b *batch, d *delivery) (later *delivery) {
	for {
		if a.n.ctx.Err() != nil {
			a.dropped(d, mailbox.DroppedClosed) // uncharges it
		} else if a.add(b, d) {
			return d
		}
		if len(b.items) >= a.opts.batchMax {
			return nil
		}
		next, ok := a.mb.TakeIf(batchable)
		if !ok {
			return nil
		}
		a.left(next)
		d = next
	}
}

// add decides d against b: answers it now (as handleStream would), adds it
// to b, or reports that it must wait for b's outcome.
func (a *actor) add(b *batch, d *delivery) (wait bool) {
	n, env := a.n, d.env
	if a.refuseWhileStoreFailed(d) {
		d.uncharge()
		return false
	}
	st, err := n.in.acquire(d.stream, a.applied())
	if err != nil {
		a.receipt(d, nil, &pb.Receipt{Code: pb.Receipt_NO_SUCH_ACTOR, RetryAfterMs: 1000, Message: "node is stopping"})
		d.uncharge()
		return false
	}
	rc := func(r *pb.Receipt) { a.receipt(d, st, r) }
	if n.evictions.pending(d.stream) {
		a.refuseWhileEvicting(d, rc)
		d.uncharge()
		n.in.release(st)
		return false
	}
	seq, prev := env.GetSequence(), env.GetPrevSequence()
	var scoped []byte
	if k := env.GetIdempotencyKey(); k != "" {
		scoped = outbox.ScopedKey(d.from, a.name, k)
		if _, dup := b.keys[string(scoped)]; dup {
			n.in.release(st)
			return true
		}
	}
	if pw, in := b.last[st]; in {
		// The stream has messages in the batch: only its next message can
		// be decided now; anything else is decided once they are.
		expired := d.deadlineMs > 0 && n.store.ElapsedMs() >= d.deadlineMs
		// Nor one chained to pw when another message than the batch's
		// was refused under pw (the stream's sender restored from a
		// backup): that is found out only once the batch's moved the
		// watermark.
		if seq <= pw || (prev != 0 && prev != pw) || expired || b.otherRefusedAt(n.in, st, pw) {
			n.in.release(st)
			return true
		}
		if scoped != nil {
			if seen, err := n.store.KeySeen(scoped); err != nil || seen {
				n.in.release(st)
				return true
			}
		}
	} else {
		w := st.w.Load()
		positive := func(code pb.Receipt_Code) func(error, uint64) { return n.in.onDurable(st, rc, code) }
		answered := true
		switch {
		case n.in.divergent(st, env):
			n.stats.diverged.Add(1)
			n.in.answerDiverged(st, rc)
		case seq <= w:
			n.stats.dedupeHits.Add(1)
			n.in.afterDurable(st, seq, positive(pb.Receipt_DUPLICATE))
		case w == 0 && seq <= st.horizon():
			n.stats.forgotten.Add(1)
			rc(&pb.Receipt{Code: pb.Receipt_FORGOTTEN, Watermark: st.horizon(),
				Message: "this node forgot the stream (idle past its retention) and the message is older than what it forgot"})
		case prev != 0 && prev != w:
			n.stats.outOfOrder.Add(1)
			rc(&pb.Receipt{Code: pb.Receipt_OUT_OF_ORDER, Watermark: w})
		case d.deadlineMs > 0 && n.store.ElapsedMs() >= d.deadlineMs:
			n.stats.expired.Add(1)
			rc(&pb.Receipt{Code: pb.Receipt_EXPIRED, Message: "expired before processing"})
		case scoped != nil:
			seen, err := n.store.KeySeen(scoped)
			switch {
			case err != nil:
				rc(&pb.Receipt{Code: pb.Receipt_NO_SUCH_ACTOR, RetryAfterMs: 1000, Message: "node is stopping"})
			case seen:
				// Sent before under this key: it took effect then.
				n.stats.dedupeHits.Add(1)
				n.in.advance(st, seq, pb.StreamDigest(env), nil, positive(pb.Receipt_DUPLICATE))
			default:
				answered = false
			}
		default:
			answered = false
		}
		if answered {
			d.uncharge()
			n.in.release(st)
			return false
		}
	}
	// The batch's context ends at its earliest TTL: a message with less
	// TTL left than HandlerTimeout runs alone, so that it cuts short no
	// other message's handler (a failure there would be charged to that
	// message, perhaps another sender's).
	short := d.deadlineMs > 0 && d.deadlineMs-n.store.ElapsedMs() < n.cfg.HandlerTimeout.Milliseconds()
	if len(b.items) > 0 && (short || b.short) {
		n.in.release(st)
		return true
	}
	b.short = short
	it := batchItem{d: d, st: st}
	if scoped != nil {
		it.keys = [][]byte{scoped}
		b.keys[string(scoped)] = struct{}{}
	}
	b.last[st] = seq
	b.items = append(b.items, it)
	b.msgs = append(b.msgs, &d.Message)
	return false
}

// otherRefusedAt reports whether a message of st other than b's last one
// of st, under pw, was refused under pw and is kept (refusals.other).
func (b *batch) otherRefusedAt(in *inbound, st *inStream, pw uint64) bool {
	if in.refused.n.Load() == 0 {
		return false
	}
	for i := len(b.items) - 1; i >= 0; i-- {
		if it := b.items[i]; it.st == st {
			return in.refused.other(st.key, pw, func() uint64 { return pb.StreamDigest(it.d.env) })
		}
	}
	return false
}

// runBatch runs b's messages through the BatchHandler and answers each:
// the ones that took effect move their streams' watermarks, in order, and
// are acknowledged once those are durable. It reports whether all did.
func (a *actor) runBatch(b *batch) bool {
	if len(b.items) == 0 {
		return true
	}
	n := a.n
	// One context for the batch, bounded by its earliest TTL.
	var earliest int64
	for _, it := range b.items {
		if dl := it.d.deadlineMs; dl > 0 && (earliest == 0 || dl < earliest) {
			earliest = dl
		}
	}
	timeout := n.cfg.HandlerTimeout
	if earliest > 0 {
		timeout = min(timeout, time.Duration(earliest-n.store.ElapsedMs())*time.Millisecond)
	}
	ctx := withLazyDeadline(n.ctx, time.Now().Add(timeout))
	done, err, panicked := a.callBatch(ctx, b.msgs)
	ctx.release()
	if panicked && len(b.items) > 1 {
		// Which message? Run them one by one: only that one fails, and
		// what follows it is not run (a successor of a failed message of
		// its stream must not run before it).
		items, msgs := b.items, b.msgs
		for i := range items {
			b.items, b.msgs = items[i:i+1], msgs[i:i+1]
			if !a.runBatch(b) {
				b.items, b.msgs = items[i+1:], msgs[i+1:]
				a.answerBatch(b, 0, nil)
				break
			}
		}
		b.items, b.msgs = items, msgs
		return false
	}
	done = min(max(done, 0), len(b.items))
	a.answerBatch(b, done, err)
	return done == len(b.items)
}

// answerBatch answers b's messages after a run in which the first done
// took effect and msgs[done] failed with err (nil: was not run).
func (a *actor) answerBatch(b *batch, done int, err error) {
	n := a.n
	for i, it := range b.items {
		d, st, seq := it.d, it.st, it.d.env.GetSequence()
		rc := func(r *pb.Receipt) { a.receipt(d, st, r) }
		switch {
		case i < done:
			// Each message's digest, also in a run of one stream's: a
			// commit may start at any of them (the first starts at once)
			// and record its watermark.
			n.in.advance(st, seq, pb.StreamDigest(d.env), it.keys, n.in.onDurable(st, rc, pb.Receipt_PROCESSED))
		case i == done && err != nil:
			r := &pb.Receipt{Code: pb.Receipt_TRANSIENT, Message: err.Error()}
			var ce *CapacityError
			switch {
			case mailbox.IsPermanent(err):
				r.Code = pb.Receipt_REJECTED
			case errors.As(err, &ce):
				r.Code, r.RetryAfterMs = pb.Receipt_CAPACITY, max(ce.RetryAfter.Milliseconds(), 1)
			}
			rc(r)
		default:
			// Not run: not the message's fault, so not an attempt.
			retry := int64(notRunRetry / time.Millisecond)
			var ce *CapacityError
			if errors.As(err, &ce) {
				retry = max(ce.RetryAfter.Milliseconds(), 1)
			}
			rc(&pb.Receipt{Code: pb.Receipt_CAPACITY, RetryAfterMs: retry, Message: "not run: an earlier message of its batch failed"})
		}
		d.uncharge()
		n.in.release(st)
	}
}

// notRunRetry is the retry hint of a batched message that was not run
// because one before it failed.
const notRunRetry = 10 * time.Millisecond

// callBatch runs the BatchHandler, recovering a panic.
func (a *actor) callBatch(ctx context.Context, msgs []*Message) (done int, err error, panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			a.n.stats.panics.Add(1)
			a.n.log.Error("batch handler panicked", "actor", a.name, "msgs", len(msgs), "panic", r, "stack", string(debug.Stack()))
			done, err, panicked = 0, Permanent(fmt.Errorf("node: batch handler of %q panicked: %v", a.name, r)), true
		}
	}()
	done, err = a.opts.batch(ctx, msgs)
	return done, err, false
}

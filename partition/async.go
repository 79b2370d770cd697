package partition

import (
	"context"
	"fmt"
	"sync"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// SendAsync stores one reliable message without a direct attempt and
// without waiting for its commit: done is called once, after the
// transaction that holds the message is fsynced (Sent{Outcome: Queued}),
// or with the error that kept it from being stored. It is Send for a
// producer that pipelines: its messages share the store's group commits
// however few goroutines it runs.
//
// The sequence is taken before SendAsync returns, under the stream's lock
// as in Send, so one goroutine's messages to a recipient keep the order of
// its calls; the stream holds back everything above a sequence still
// committing, as for Send. A problem found before the hand-off to the
// store (closed, a bad message, ctx done while the store's queue is full)
// is returned, nothing is stored and done is never called. done runs on
// the store's committer goroutine: it must not block.
func (r *Relay) SendAsync(ctx context.Context, sm *pb.StoredMessage, done func(Sent, error)) error {
	if r.ctx.Err() != nil {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("partition: send: %w", err)
	}
	if sm.GetCreatedElapsedMs() == 0 {
		sm.CreatedElapsedMs = r.store.ElapsedMs()
	}
	rcpt := sm.GetEnvelope().GetRecipient()
	st, err := r.lockStream(rcpt)
	if err != nil {
		return fmt.Errorf("partition: send to %s: %w", rcpt, err)
	}
	seq, err := r.store.ReserveSequence()
	if err == nil {
		sm.GetEnvelope().Sequence = seq
		st.storing = append(st.storing, seq)
	}
	st.mu.Unlock()
	if err != nil {
		return fmt.Errorf("partition: send to %s: %w", rcpt, err)
	}
	err = r.store.EnqueueAsync(ctx, sm, func(_ outbox.Result, err error) {
		// The committer must not take a stream's lock (a stream's holder
		// may be waiting for the committer): the stream learns of the
		// commit on the relay's own goroutine.
		r.committed.add(st, seq)
		if err != nil {
			done(Sent{}, fmt.Errorf("partition: send to %s: %w", rcpt, err))
			return
		}
		done(Sent{Outcome: Queued}, nil)
	})
	if err != nil {
		r.doneStoring(st, seq)
		return fmt.Errorf("partition: send to %s: %w", rcpt, err)
	}
	return nil
}

// commits hands the commits of SendAsync's messages from the store's
// committer to the relay's completer goroutine, which takes them off
// their streams' storing lists. The list grows only by the messages the
// store is committing, which its queue bounds.
type commits struct {
	wake chan struct{} // cap 1: a pending hand-off

	// mu guards the field below. Nothing is locked under it.
	mu   sync.Mutex
	list []storedSeq
}

type storedSeq struct {
	st  *stream
	seq uint64
}

// add never blocks: it runs on the store's committer.
func (c *commits) add(st *stream, seq uint64) {
	c.mu.Lock()
	c.list = append(c.list, storedSeq{st, seq})
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *commits) take(buf []storedSeq) []storedSeq {
	c.mu.Lock()
	defer c.mu.Unlock()
	buf = append(buf[:0], c.list...)
	clear(c.list)
	c.list = c.list[:0]
	return buf
}

// complete runs from New to Close: it ends the storing state of every
// message SendAsync stored, so its stream may send it.
func (r *Relay) complete() {
	defer r.wg.Done()
	var buf []storedSeq
	for {
		select {
		case <-r.committed.wake:
		case <-r.ctx.Done():
			return
		}
		buf = r.committed.take(buf)
		for run := buf; len(run) > 0; {
			n := 1 // the run of commits to one stream
			for n < len(run) && run[n].st == run[0].st {
				n++
			}
			r.doneStoringRun(run[0].st, run[:n])
			run = run[n:]
		}
		clear(buf)
	}
}

package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Result says what Enqueue did with a message.
type Result uint8

const (
	// Queued: stored in the recipient's queue at its sequence.
	Queued Result = iota
	// Replaced: an OVERWRITE message replaced the waiting older version
	// with the same (recipient, coalesce key).
	Replaced
	// Superseded: an OVERWRITE message was older than the waiting version
	// with the same (recipient, coalesce key) and was dropped.
	Superseded
)

func (r Result) String() string {
	switch r {
	case Queued:
		return "queued"
	case Replaced:
		return "replaced"
	case Superseded:
		return "superseded"
	}
	return fmt.Sprintf("Result(%d)", uint8(r))
}

// Enqueue stores sm durably and returns only after the fsync of the
// transaction that contains it (group commit). The envelope's sequence must
// be set (ReserveSequence): it places the message in its recipient's queue
// and never changes. sm.CreatedElapsedMs zero means now. The relay is woken
// through the OnEnqueue hook.
func (s *Store) Enqueue(ctx context.Context, sm *pb.StoredMessage) (Result, error) {
	rec, err := s.prepare(sm)
	if err != nil {
		return 0, err
	}
	o := newOneEnqueue(sm, rec)
	if err := s.submit(ctx, o); err != nil {
		return 0, err
	}
	if o.errs[0] != nil {
		return 0, o.errs[0]
	}
	return o.results[0], o.err
}

// oneEnqueue is the op of an Enqueue or EnqueueAsync with the slices of its
// one message in the same allocation: one allocation per durable send
// instead of five (six with EnqueueAsync's callback).
type oneEnqueue struct {
	op
	msg [1]*pb.StoredMessage
	rec [1][]byte
	res [1]Result
	err [1]error
}

func newOneEnqueue(sm *pb.StoredMessage, rec []byte) *op {
	one := &oneEnqueue{msg: [1]*pb.StoredMessage{sm}, rec: [1][]byte{rec}}
	one.op = op{kind: opEnqueue, msgs: one.msg[:], recs: one.rec[:], results: one.res[:], errs: one.err[:], bytes: len(rec) - recHeaderLen(rec)}
	return &one.op
}

// EnqueueBatch stores msgs and returns one Result and one error per
// message. Messages are committed in groups of at most MaxBatchBytes (the
// committer does not join groups beyond it either), so a fan-out of big
// bodies never becomes one huge transaction: a failure may then leave some
// groups stored and others not (each error says which).
func (s *Store) EnqueueBatch(ctx context.Context, msgs []*pb.StoredMessage) ([]Result, []error) {
	results, errs := make([]Result, len(msgs)), make([]error, len(msgs))
	var group []int
	recs := make([][]byte, len(msgs))
	bytes := 0
	flush := func() {
		if len(group) == 0 {
			return
		}
		o := &op{kind: opEnqueue, msgs: make([]*pb.StoredMessage, len(group)), recs: make([][]byte, len(group)), results: make([]Result, len(group)), errs: make([]error, len(group)), bytes: bytes}
		for j, i := range group {
			o.msgs[j], o.recs[j] = msgs[i], recs[i]
		}
		err := s.submit(ctx, o)
		for j, i := range group {
			results[i], errs[i] = o.results[j], o.errs[j]
			if errs[i] == nil {
				errs[i] = err
			}
			if errs[i] == nil {
				errs[i] = o.err
			}
		}
		group, bytes = group[:0], 0
	}
	for i, sm := range msgs {
		if recs[i], errs[i] = s.prepare(sm); errs[i] != nil {
			continue
		}
		size := len(recs[i]) - recHeaderLen(recs[i])
		if len(group) > 0 && (bytes+size > s.cfg.MaxBatchBytes || len(group) >= s.cfg.MaxBatch) {
			flush()
		}
		group = append(group, i)
		bytes += size
	}
	flush()
	return results, errs
}

// prepare validates sm and encodes it as a queue record, on the caller's
// goroutine: the committer, which every write waits for, then only stores
// it.
func (s *Store) prepare(sm *pb.StoredMessage) ([]byte, error) {
	if err := s.precheck(sm); err != nil {
		return nil, err
	}
	rec, err := encodeMessage(sm)
	if err != nil {
		r := sm.GetEnvelope().GetRecipient()
		return nil, fmt.Errorf("outbox: enqueue to %s: %w: %w", r, ErrBadMessage, err)
	}
	return rec, nil
}

// precheck validates sm before it reaches the committer.
func (s *Store) precheck(sm *pb.StoredMessage) error {
	env := sm.GetEnvelope()
	if env == nil {
		return fmt.Errorf("outbox: enqueue: %w", ErrNoRecipient)
	}
	r := env.GetRecipient()
	if err := checkRecipient(r); err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
	}
	switch {
	case env.GetSequence() == 0:
		return fmt.Errorf("outbox: enqueue to %s: %w: no sequence", r, ErrBadMessage)
	case env.GetSequence() > MaxSequence:
		return fmt.Errorf("outbox: enqueue to %s: %w: sequence %d is above %d, the highest an outbox stores", r, ErrBadMessage, env.GetSequence(), uint64(MaxSequence))
	case len(env.GetIdempotencyKey()) > MaxKeyLen || len(env.GetCoalesceKey()) > MaxKeyLen:
		return fmt.Errorf("outbox: enqueue to %s: %w: key longer than %d bytes", r, ErrBadMessage, MaxKeyLen)
	case env.GetTtlMs() < 0:
		return fmt.Errorf("outbox: enqueue to %s: %w: negative TTL", r, ErrBadMessage)
	case env.GetTtlMs() > s.cfg.MaxAge().Milliseconds():
		return fmt.Errorf("outbox: enqueue to %s: %w: TTL %v is longer than the %v a message may wait",
			r, ErrBadMessage, time.Duration(env.GetTtlMs())*time.Millisecond, s.cfg.MaxAge())
	}
	now := s.clock.nowMs()
	if sm.GetCreatedElapsedMs() == 0 {
		sm.CreatedElapsedMs = now
	}
	if t := env.GetTtlMs(); t > 0 && sm.GetCreatedElapsedMs()+t <= now {
		s.expired.Add(1)
		return fmt.Errorf("outbox: enqueue to %s: %w", r, ErrExpired)
	}
	return nil
}

// EnqueueAsync hands sm to the committer and returns without waiting for
// the commit: done is called once with its Result after the transaction
// that holds it is fsynced, or with the error that kept it from being
// stored. It is the pipelined form of Enqueue: a producer that queues many
// messages this way shares one fsync among all of them, however few
// goroutines it runs.
//
// A problem found before the hand-off (a bad message, a closed store, ctx
// done while the committer's queue is full) is returned and done is never
// called. Ops reach the committer in the order of the calls that returned,
// and it commits them in that order, so the callbacks of one goroutine's
// calls run in call order. done runs on the committer goroutine: it must
// not block and must not wait for the store.
func (s *Store) EnqueueAsync(ctx context.Context, sm *pb.StoredMessage, done func(Result, error)) error {
	rec, err := s.prepare(sm)
	if err != nil {
		return err
	}
	o := newOneEnqueue(sm, rec)
	o.enqueued = done
	// asyncMu (read) keeps Close from closing s.closing between the check
	// and the send: an op that made it into s.ops is always committed by
	// the committer's final drain, so done always runs.
	s.asyncMu.RLock()
	defer s.asyncMu.RUnlock()
	if err := s.usableErr(); err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
	}
	select {
	case s.ops <- o:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("outbox: enqueue: %w", ctx.Err())
	}
}

package outbox

import (
	"context"
	"fmt"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Result says what Enqueue did with an envelope.
type Result uint8

const (
	// Queued: appended at the tail of the recipient's queue.
	Queued Result = iota
	// Replaced: an OVERWRITE envelope replaced the waiting message with the
	// same (recipient, idempotency key); the old one was removed and the new
	// one appended at the tail.
	Replaced
	// Superseded: an OVERWRITE envelope was older than (or as old as) the
	// newest message seen for its (recipient, key) and was dropped.
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

// Enqueue stores env durably and returns only after the fsync of the
// transaction that contains it (group commit). A zero env.Sequence is
// assigned from NextSequence; Enqueue writes the final sequence back into
// env.Sequence. A superseded OVERWRITE envelope returns nil (use
// EnqueueResult to tell). The relay is woken through the OnEnqueue hook.
func (s *Store) Enqueue(ctx context.Context, env *pb.Envelope) error {
	_, err := s.EnqueueResult(ctx, env)
	return err
}

// EnqueueResult is Enqueue that also reports whether env was queued,
// replaced a waiting message, or was dropped as superseded.
func (s *Store) EnqueueResult(ctx context.Context, env *pb.Envelope) (Result, error) {
	o := &op{kind: opEnqueue, envs: []*pb.Envelope{env}, results: make([]Result, 1), errs: make([]error, 1)}
	if o.errs[0] = s.precheck(env); o.errs[0] != nil {
		return 0, o.errs[0]
	}
	if err := s.submit(ctx, o); err != nil {
		return 0, err
	}
	if o.errs[0] != nil {
		return 0, o.errs[0]
	}
	return o.results[0], o.err
}

// EnqueueBatch stores envs in one commit and returns one error per envelope
// (nil = stored or superseded). Dispatch uses it for fan-out.
func (s *Store) EnqueueBatch(ctx context.Context, envs []*pb.Envelope) []error {
	_, errs := s.EnqueueBatchResult(ctx, envs)
	return errs
}

// EnqueueBatchResult is EnqueueBatch that also reports each envelope's Result.
func (s *Store) EnqueueBatchResult(ctx context.Context, envs []*pb.Envelope) ([]Result, []error) {
	o := &op{kind: opEnqueue, envs: envs, results: make([]Result, len(envs)), errs: make([]error, len(envs))}
	valid := 0
	for i, env := range envs {
		if o.errs[i] = s.precheck(env); o.errs[i] == nil {
			valid++
		}
	}
	if valid == 0 {
		return o.results, o.errs
	}
	if err := s.submit(ctx, o); err != nil {
		for i := range o.errs {
			if o.errs[i] == nil {
				o.errs[i] = err
			}
		}
	}
	return o.results, o.errs
}

// precheck validates env before it reaches the committer.
func (s *Store) precheck(env *pb.Envelope) error {
	if env == nil {
		return fmt.Errorf("outbox: enqueue: %w", ErrNoRecipient)
	}
	if err := checkRecipient(env.GetRecipient()); err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
	}
	if len(env.GetIdempotencyKey()) > MaxKeyLen {
		return fmt.Errorf("outbox: enqueue to %s: idempotency key of %d bytes (max %d): %w",
			env.GetRecipient(), len(env.GetIdempotencyKey()), MaxKeyLen, ErrBadKey)
	}
	if expiredAt(env, s.cfg.Now().UnixMilli()) {
		s.expired.Add(1)
		return fmt.Errorf("outbox: enqueue to %s: %w", env.GetRecipient(), ErrExpired)
	}
	return nil
}

package outbox

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// DeadLetter is one record of the dead-letter queue.
type DeadLetter struct {
	ID        string // stable id (16 hex digits, increasing in arrival order)
	Recipient string
	Reason    string // "expired", "max attempts", "rejected: ...", "undecodable"
	At        time.Time
	Message   *pb.StoredMessage
}

// DLQFilter selects dead letters. Zero fields do not filter.
type DLQFilter struct {
	Recipient string        // exact recipient
	Node      string        // recipients "…@Node"
	Reason    string        // reason prefix ("rejected" matches "rejected: bad body")
	OlderThan time.Duration // dead-lettered at least this long ago
	IDs       []string      // only these ids
	Limit     int           // DeadLetters: 0 = 100; Replay/Purge: 0 = every match
	All       bool          // Replay/Purge: required when every other field is zero
}

func (f DLQFilter) empty() bool {
	return f.Recipient == "" && f.Node == "" && f.Reason == "" && f.OlderThan == 0 && len(f.IDs) == 0
}

func (f DLQFilter) match(id string, sm *pb.StoredMessage, now time.Time) bool {
	r := sm.GetEnvelope().GetRecipient()
	switch {
	case f.Recipient != "" && r != f.Recipient:
		return false
	case f.Node != "" && nodeOf(r) != f.Node:
		return false
	case f.Reason != "" && !strings.HasPrefix(sm.GetDeadLetterReason(), f.Reason):
		return false
	case f.OlderThan > 0 && sm.GetDeadLetteredUnixMs() > now.Add(-f.OlderThan).UnixMilli():
		return false
	case len(f.IDs) > 0 && !slices.Contains(f.IDs, id):
		return false
	}
	return true
}

func dlqID(k []byte) string { return hex.EncodeToString(k) }

// DeadLetters lists dead letters matching f, oldest first.
func (s *Store) DeadLetters(f DLQFilter) ([]DeadLetter, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	now := s.cfg.Now()
	var out []DeadLetter
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketDLQ).Cursor()
		for k, v := c.First(); k != nil && len(out) < limit; k, v = c.Next() {
			sm := &pb.StoredMessage{}
			if err := proto.Unmarshal(v, sm); err != nil {
				return fmt.Errorf("%w: dead letter %s: %w", ErrCorrupt, dlqID(k), err)
			}
			id := dlqID(k)
			if !f.match(id, sm, now) {
				continue
			}
			out = append(out, DeadLetter{
				ID:        id,
				Recipient: sm.GetEnvelope().GetRecipient(),
				Reason:    sm.GetDeadLetterReason(),
				At:        time.UnixMilli(sm.GetDeadLetteredUnixMs()),
				Message:   sm,
			})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: dead letters: %w", err)
	}
	return out, nil
}

// Replay moves matching dead letters back to the tail of their recipient's
// queue with attempts and dead-letter fields reset and a fresh sequence,
// and wakes the relay. It returns how many were replayed. An empty filter
// needs f.All.
func (s *Store) Replay(f DLQFilter) (int, error) {
	return s.dlqOp(opReplay, f)
}

// Purge deletes matching dead letters and returns how many. An empty filter
// needs f.All.
func (s *Store) Purge(f DLQFilter) (int, error) {
	return s.dlqOp(opPurge, f)
}

func (s *Store) dlqOp(kind opKind, f DLQFilter) (int, error) {
	if f.empty() && !f.All {
		return 0, fmt.Errorf("outbox: %s: %w", kind, ErrEmptyFilter)
	}
	o := &op{kind: kind, filter: f}
	if err := s.submit(context.Background(), o); err != nil {
		return 0, fmt.Errorf("outbox: %s: %w", kind, err)
	}
	return o.n, o.err
}

func (s *Store) applyDLQ(tx *bolt.Tx, b *batch, o *op) error {
	dlq := tx.Bucket(bucketDLQ)
	var keys [][]byte
	var msgs []*pb.StoredMessage
	c := dlq.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if o.filter.Limit > 0 && len(keys) >= o.filter.Limit {
			break
		}
		sm := &pb.StoredMessage{}
		if err := proto.Unmarshal(v, sm); err != nil {
			if o.kind == opPurge && (o.filter.All || slices.Contains(o.filter.IDs, dlqID(k))) {
				// A corrupt record can still be purged by id or with All.
				keys = append(keys, slices.Clone(k))
				msgs = append(msgs, nil)
			}
			continue
		}
		if !o.filter.match(dlqID(k), sm, b.now) {
			continue
		}
		keys = append(keys, slices.Clone(k))
		msgs = append(msgs, sm)
	}
	for i, k := range keys {
		if o.kind == opReplay {
			sm := msgs[i]
			if sm == nil || checkRecipient(sm.GetEnvelope().GetRecipient()) != nil {
				continue // cannot be routed; leave it for inspection
			}
			sm.Attempts = 0
			sm.DeadLetteredUnixMs = 0
			sm.DeadLetterReason = ""
			sm.Envelope.Sequence = 0
			if _, err := s.applyEnqueue(tx, b, sm.Envelope, false, sm); err != nil {
				return err
			}
		}
		if err := dlq.Delete(k); err != nil {
			return err
		}
		b.dlq--
		o.n++
	}
	return nil
}

// DeadLetter stores env straight into the dead-letter queue with reason and
// returns after the commit. It is for a message whose first attempt already
// settled its fate (the receiver refused it as poison, or it expired), so
// that it is recorded without going through a queue and being sent again.
func (s *Store) DeadLetter(ctx context.Context, env *pb.Envelope, reason string) error {
	if err := s.precheckDead(env); err != nil {
		return err
	}
	o := &op{kind: opDeadLetter, envs: []*pb.Envelope{env}, failure: Failure{Reason: reason, Permanent: true}}
	if err := s.submit(ctx, o); err != nil {
		return fmt.Errorf("outbox: dead-letter %s: %w", env.GetRecipient(), err)
	}
	if o.err != nil {
		return fmt.Errorf("outbox: dead-letter %s: %w", env.GetRecipient(), o.err)
	}
	return nil
}

func (s *Store) precheckDead(env *pb.Envelope) error {
	if env == nil {
		return fmt.Errorf("outbox: dead-letter: %w", ErrNoRecipient)
	}
	if err := checkRecipient(env.GetRecipient()); err != nil {
		return fmt.Errorf("outbox: dead-letter: %w", err)
	}
	return nil
}

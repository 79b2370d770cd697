package outbox

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/internal/address"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// DeadLetter is one record of the dead-letter queue.
type DeadLetter struct {
	ID        string // stable id (16 hex digits, increasing in arrival order)
	Recipient string
	Reason    string // "expired…", "max attempts: …", "rejected: …", "dropped: …", "undecodable"
	At        time.Time
	Message   *pb.StoredMessage
}

// DLQFilter selects dead letters. Zero fields do not filter.
type DLQFilter struct {
	Recipient string        // exact recipient
	Node      string        // recipients "…@Node"
	Reason    string        // reason prefix ("rejected" matches "rejected: bad body")
	OlderThan time.Duration // dead-lettered at least this long ago (wall clock)
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
	case f.Node != "" && address.Node(r) != f.Node:
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

// dlqPage is how many dead letters one Replay or Purge transaction moves:
// a big dead-letter queue is worked through in many short transactions,
// never one that stalls every other writer.
const dlqPage = 256

// DeadLetters lists dead letters matching f, oldest first.
func (s *Store) DeadLetters(f DLQFilter) ([]DeadLetter, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	now := s.cfg.Clock.Now()
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

// ReplayOption adjusts what Replay does with each dead letter.
type ReplayOption func(*replayOptions)

type replayOptions struct{ ttl time.Duration }

// ReplayTTL gives replayed messages this TTL (0 = none) instead of the one
// they were sent with. Either way the TTL counts from the replay.
func ReplayTTL(ttl time.Duration) ReplayOption {
	return func(o *replayOptions) { o.ttl = ttl }
}

// Replay moves matching dead letters back to the tail of their recipient's
// queue as new messages: a new sequence, attempts reset, and their TTL
// counting again from now. An OVERWRITE dead letter whose coalesce key has
// a newer version stays in the dead-letter queue (see ErrSuperseded), as
// does one older than MaxAge, for which that can no longer be told. It
// returns how many were replayed; an empty filter needs f.All. Replay works
// in short transactions of a few hundred records and at most MaxBatchBytes.
func (s *Store) Replay(f DLQFilter, opts ...ReplayOption) (int, error) {
	o := replayOptions{ttl: -1}
	for _, opt := range opts {
		opt(&o)
	}
	if o.ttl > s.cfg.MaxAge() {
		return 0, fmt.Errorf("outbox: replay: %w: TTL %v is longer than the %v a message may wait", ErrBadMessage, o.ttl, s.cfg.MaxAge())
	}
	ttl := int64(-1)
	if o.ttl >= 0 {
		ttl = o.ttl.Milliseconds()
	}
	n, skipped, err := s.dlqPages(opReplay, f, ttl)
	if err == nil && skipped > 0 && n == 0 {
		err = fmt.Errorf("outbox: replay: %d dead letters left in place: %w", skipped, ErrSuperseded)
	}
	return n, err
}

// Purge deletes matching dead letters and returns how many. An empty filter
// needs f.All. Purge works in short transactions of a few hundred records.
func (s *Store) Purge(f DLQFilter) (int, error) {
	n, _, err := s.dlqPages(opPurge, f, -1)
	return n, err
}

func (s *Store) dlqPages(kind opKind, f DLQFilter, ttl int64) (n, skipped int, err error) {
	if err := s.closedErr(); err != nil {
		return 0, 0, fmt.Errorf("outbox: %s: %w", kind, err)
	}
	if f.empty() && !f.All {
		return 0, 0, fmt.Errorf("outbox: %s: %w", kind, ErrEmptyFilter)
	}
	var after []byte
	for f.Limit <= 0 || n < f.Limit {
		page := dlqPage
		if f.Limit > 0 {
			page = min(page, f.Limit-n)
		}
		maxBytes := 0 // a purge only deletes
		if kind == opReplay {
			maxBytes = s.cfg.MaxBatchBytes // replayed records are rewritten
		}
		ids, rcpts, last, err := s.matchIDs(f, after, page, maxBytes, kind == opPurge)
		if err != nil {
			return n, skipped, fmt.Errorf("outbox: %s: %w", kind, err)
		}
		if len(ids) == 0 {
			return n, skipped, nil
		}
		after = last
		o := &op{kind: kind, ids: ids, replayTTL: ttl}
		var dones []func()
		if kind == opReplay {
			for _, r := range rcpts {
				seq, done, err := s.reserveFor(r)
				if err != nil {
					for _, d := range dones {
						d()
					}
					return n, skipped, fmt.Errorf("outbox: %s: %w", kind, err)
				}
				o.seqs, dones = append(o.seqs, seq), append(dones, done)
			}
		}
		err = s.submit(context.Background(), o)
		for _, d := range dones {
			d()
		}
		if err != nil {
			return n, skipped, fmt.Errorf("outbox: %s: %w", kind, err)
		}
		if o.err != nil {
			return n, skipped, o.err
		}
		n += o.n
		skipped += o.skipped
	}
	return n, skipped, nil
}

// Sequencer assigns the sequences of messages the store stores on its own
// (Replay). The relay is the sequencer of a running node: a sequence must
// not be sent while a lower one of the same stream may still commit, and
// only the relay knows what it sends.
type Sequencer interface {
	// Reserve returns a new sequence for a message to recipient, and a
	// done func to call once that message's commit has ended.
	Reserve(recipient string) (seq uint64, done func(), err error)
}

// SetSequencer installs the sequencer Replay uses (nil: ReserveSequence).
func (s *Store) SetSequencer(q Sequencer) {
	s.seqr.Store(&q)
}

func (s *Store) reserveFor(recipient string) (uint64, func(), error) {
	if q := s.seqr.Load(); q != nil && *q != nil {
		return (*q).Reserve(recipient)
	}
	seq, err := s.ReserveSequence()
	return seq, func() {}, err
}

// matchIDs returns up to limit keys of matching dead letters after the key
// after, of at most maxBytes of records (0 = any; never fewer than one),
// and the last key it looked at. Corrupt records match only a purge by id
// or with All.
func (s *Store) matchIDs(f DLQFilter, after []byte, limit, maxBytes int, purge bool) (ids [][]byte, rcpts []string, last []byte, err error) {
	size := 0
	now := s.cfg.Clock.Now()
	err = s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketDLQ).Cursor()
		k, v := c.First()
		if after != nil {
			k, v = c.Seek(after)
			if k != nil && bytes.Equal(k, after) {
				k, v = c.Next()
			}
		}
		for ; k != nil && len(ids) < limit; k, v = c.Next() {
			if maxBytes > 0 && len(ids) > 0 && size+len(v) > maxBytes {
				break // this one opens the next page
			}
			last = bytes.Clone(k)
			sm := &pb.StoredMessage{}
			if err := proto.Unmarshal(v, sm); err != nil {
				if purge && (f.All || slices.Contains(f.IDs, dlqID(k))) {
					ids, rcpts = append(ids, last), append(rcpts, "")
				}
				continue
			}
			if f.match(dlqID(k), sm, now) {
				ids, rcpts = append(ids, last), append(rcpts, sm.GetEnvelope().GetRecipient())
				size += len(v)
			}
		}
		return nil
	})
	return ids, rcpts, last, err
}

func (s *Store) applyReplay(tx *bolt.Tx, b *batch, o *op) error {
	dlq, co := tx.Bucket(bucketDLQ), tx.Bucket(bucketCoalesce)
	for i, k := range o.ids {
		v := dlq.Get(k)
		if v == nil {
			continue
		}
		sm := &pb.StoredMessage{}
		if err := proto.Unmarshal(v, sm); err != nil || checkRecipient(sm.GetEnvelope().GetRecipient()) != nil {
			o.skipped++ // cannot be routed; left for inspection
			continue
		}
		env := sm.GetEnvelope()
		if env.GetConflict() == pb.Envelope_OVERWRITE && env.GetCoalesceKey() != "" {
			cv := co.Get(coalesceKey(env.GetRecipient(), env.GetCoalesceKey()))
			switch {
			case len(cv) >= 8 && seqOf(cv) > env.GetSequence():
				o.skipped++ // a newer version exists: replaying would run an older one after it
				continue
			case len(cv) < 8 && sm.GetCreatedElapsedMs()+s.cfg.MaxAge().Milliseconds() <= b.nowMs:
				// Index entries are pruned MaxAge after their last change:
				// whether a newer version ran can no longer be told.
				o.skipped++
				continue
			}
		}
		sm.Attempts, sm.DeadLetteredUnixMs, sm.DeadLetterReason, sm.LastError = 0, 0, "", ""
		sm.CreatedElapsedMs = b.nowMs
		env.Sequence = o.seqs[i]
		if o.replayTTL >= 0 {
			env.TtlMs = o.replayTTL
		}
		if _, err := s.applyEnqueue(tx, b, sm, nil); err != nil {
			return err
		}
		if err := dlq.Delete(k); err != nil {
			return err
		}
		b.dlq--
		o.n++
	}
	return nil
}

// DeadLetter stores sm straight into the dead-letter queue with reason and
// returns after the commit. It is for a message whose first attempt already
// settled its fate (the receiver refused it as poison, or it expired), so
// that it is recorded without going through a queue and being sent again.
func (s *Store) DeadLetter(ctx context.Context, sm *pb.StoredMessage, reason string) error {
	if err := checkRecipient(sm.GetEnvelope().GetRecipient()); err != nil {
		return fmt.Errorf("outbox: dead-letter: %w", err)
	}
	o := &op{kind: opDeadLetter, msgs: []*pb.StoredMessage{sm}, reason: reason}
	if err := s.submit(ctx, o); err != nil {
		return fmt.Errorf("outbox: dead-letter %s: %w", sm.GetEnvelope().GetRecipient(), err)
	}
	if o.err != nil {
		return fmt.Errorf("outbox: dead-letter %s: %w", sm.GetEnvelope().GetRecipient(), o.err)
	}
	return nil
}

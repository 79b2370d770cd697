package outbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Bucket names. See doc.go for the layout.
var (
	bucketQueues   = []byte("q")
	bucketCoalesce = []byte("coalesce")
	bucketDLQ      = []byte("dlq")
	bucketDedupe   = []byte("dedupe")
	bucketMeta     = []byte("meta")
	keySeqHigh     = []byte("seq")
)

// maxRecipientLen bounds recipient names, which become bbolt bucket names.
const maxRecipientLen = 1024

// rstate is the small in-memory state of one non-empty recipient queue. No
// message bodies live in memory, so a million queued messages cost only the
// bytes of their recipients' rstates.
type rstate struct {
	name     string
	node     string
	count    int    // messages in the queue (== keys in q/<name>)
	headSeq  uint64 // sequence of the oldest message
	oldestMs int64  // first_enqueued of the oldest message
	sendAt   int64  // unix nanos; the recipient is due when sendAt <= now
}

func lessRS(a, b *rstate) bool {
	if a.sendAt != b.sendAt {
		return a.sendAt < b.sendAt
	}
	return a.name < b.name
}

// Store is the durable outbox. All methods are safe for concurrent use.
type Store struct {
	cfg Config
	db  *bolt.DB

	ops      chan *op
	closing  chan struct{} // closed by Close: the committer drains and exits
	stopped  chan struct{} // closed by the committer when it has exited
	closeMu  sync.Mutex
	isClosed bool

	seq       atomic.Uint64 // last sequence handed out
	onEnqueue atomic.Pointer[func(string)]

	// mu guards the fields below. Lock order: mu before lmu and dmu; the
	// committer takes mu only after its transaction committed.
	mu     sync.RWMutex
	rs     map[string]*rstate            // non-empty queues only
	byNode map[string]map[string]*rstate // node -> recipient -> state
	due    *btree.BTreeG[*rstate]        // every rstate, by (sendAt, name)
	depth  int                           // sum of rs[*].count
	dlqLen int                           // records in the dlq bucket

	// lmu guards the fields below.
	lmu      sync.Mutex
	limiters map[string]*Limiter

	// dmu guards the fields below.
	dmu         sync.RWMutex
	dedupe      map[string]int64 // sender\x00key -> recorded unix ms
	pendingKeys map[string]int   // sender\x00key -> RecordAsync calls not yet committed
	lastPrune   time.Time

	// asyncMu orders RecordAsync's hand-off before Close: readers are
	// RecordAsync calls between their closed check and their send on ops,
	// the writer is Close closing s.closing. Lock order: closeMu before
	// asyncMu before dmu.
	asyncMu sync.RWMutex

	retries, deadLettered, expired, delivered, enqueued atomic.Uint64
	coalesced, superseded, dedupeHits, fsyncs           atomic.Uint64
}

// Open opens (creating if needed) the outbox file and rebuilds the
// in-memory indexes from it. If another process holds the file, Open fails
// with ErrLocked after cfg.LockTimeout.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("outbox: open: %w", err)
	}
	// NoFreelistSync keeps durability (every commit is still fsynced; the
	// freelist is rebuilt by scanning the file at Open) and saves writing
	// the freelist pages in every commit; the hashmap freelist makes
	// allocation O(1) in a fragmented file (a drained backlog frees many
	// pages). Never NoSync.
	db, err := bolt.Open(cfg.Path, 0o600, &bolt.Options{
		Timeout:        cfg.LockTimeout,
		NoSync:         false,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("outbox: open %s: %w (waited %v; stop the other node using this data directory): %w",
				cfg.Path, ErrLocked, cfg.LockTimeout, err)
		}
		return nil, fmt.Errorf("outbox: open %s: %w", cfg.Path, err)
	}
	s := &Store{
		cfg:      cfg,
		db:       db,
		ops:      make(chan *op, cfg.QueueSize),
		closing:  make(chan struct{}),
		stopped:  make(chan struct{}),
		rs:       make(map[string]*rstate),
		byNode:   make(map[string]map[string]*rstate),
		due:      btree.NewG(32, lessRS),
		limiters: make(map[string]*Limiter),
		dedupe:   make(map[string]int64),

		pendingKeys: make(map[string]int),
	}
	if err := s.load(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("outbox: open %s: %w", cfg.Path, err)
	}
	go s.run()
	return s, nil
}

// load creates the buckets and rebuilds every in-memory index.
func (s *Store) load() error {
	now := s.cfg.Now()
	var high uint64
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketQueues, bucketCoalesce, bucketDLQ, bucketDedupe, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		if v := tx.Bucket(bucketMeta).Get(keySeqHigh); len(v) == 8 {
			high = binary.BigEndian.Uint64(v)
		}
		q := tx.Bucket(bucketQueues)
		err := q.ForEachBucket(func(name []byte) error {
			qb := q.Bucket(name)
			c := qb.Cursor()
			k, v := c.First()
			if k == nil {
				return nil
			}
			r := string(name)
			st := &rstate{name: r, node: nodeOf(r), headSeq: binary.BigEndian.Uint64(k), oldestMs: enqueuedMs(v), sendAt: now.UnixNano()}
			for ; k != nil; k, _ = c.Next() {
				st.count++
				if sq := binary.BigEndian.Uint64(k); sq > high {
					high = sq
				}
			}
			s.insertRS(st)
			return nil
		})
		if err != nil {
			return fmt.Errorf("load queues: %w", err)
		}
		s.dlqLen = tx.Bucket(bucketDLQ).Stats().KeyN
		cutoff := now.Add(-s.cfg.DedupeWindow).UnixMilli()
		return tx.Bucket(bucketDedupe).ForEach(func(k, v []byte) error {
			if len(v) == 8 {
				if ms := int64(binary.BigEndian.Uint64(v)); ms >= cutoff {
					s.dedupe[string(k)] = ms
				}
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	start := max(high+1, uint64(time.Now().UnixNano()))
	s.seq.Store(start - 1)
	s.lastPrune = now
	return nil
}

// insertRS adds a new non-empty recipient to every index. Caller holds mu.
func (s *Store) insertRS(st *rstate) {
	s.rs[st.name] = st
	m := s.byNode[st.node]
	if m == nil {
		m = make(map[string]*rstate)
		s.byNode[st.node] = m
	}
	m[st.name] = st
	s.due.ReplaceOrInsert(st)
	s.depth += st.count
}

// removeRS drops an emptied recipient from every index. Caller holds mu.
func (s *Store) removeRS(st *rstate) {
	delete(s.rs, st.name)
	if m := s.byNode[st.node]; m != nil {
		delete(m, st.name)
		if len(m) == 0 {
			delete(s.byNode, st.node)
		}
	}
	s.due.Delete(st)
}

// setSendAt moves st in the due index. Caller holds mu.
func (s *Store) setSendAt(st *rstate, at int64) {
	if st.sendAt == at {
		return
	}
	s.due.Delete(st)
	st.sendAt = at
	s.due.ReplaceOrInsert(st)
}

// Close stops the committer after it has committed every operation already
// queued, then closes the file. The first call returns the file's close
// error; later calls return ErrClosed.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.isClosed {
		s.closeMu.Unlock()
		return ErrClosed
	}
	s.isClosed = true
	s.asyncMu.Lock()
	close(s.closing)
	s.asyncMu.Unlock()
	s.closeMu.Unlock()
	<-s.stopped
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("outbox: close: %w", err)
	}
	return nil
}

// NextSequence returns a new sequence number, monotonic across restarts:
// it is seeded at Open with max(persisted high-water + 1, wall clock ns).
func (s *Store) NextSequence() uint64 { return s.seq.Add(1) }

// observeSeq raises the counter to at least v so explicit sequences never
// collide with later assigned ones.
func (s *Store) observeSeq(v uint64) {
	for {
		cur := s.seq.Load()
		if cur >= v || s.seq.CompareAndSwap(cur, v) {
			return
		}
	}
}

// SetOnEnqueue installs the relay's wake-up hook. It is called from the
// committer after a commit that added messages for recipient and must not
// block (the relay only signals a channel).
func (s *Store) SetOnEnqueue(f func(recipient string)) {
	if f == nil {
		s.onEnqueue.Store(nil)
		return
	}
	s.onEnqueue.Store(&f)
}

// Pending returns how many messages wait for recipient (O(1), in memory).
func (s *Store) Pending(recipient string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if st := s.rs[recipient]; st != nil {
		return st.count
	}
	return 0
}

// Limiter returns the AIMD limiter of a destination node, creating it on
// first use.
func (s *Store) Limiter(node string) *Limiter {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	l := s.limiters[node]
	if l == nil {
		l = NewLimiter(s.cfg.Limiter)
		s.limiters[node] = l
	}
	return l
}

// closedErr reports whether Close has begun.
func (s *Store) closedErr() error {
	select {
	case <-s.closing:
		return ErrClosed
	default:
		return nil
	}
}

// nodeOf returns the node part of "actor@node" (after the last '@').
func nodeOf(recipient string) string {
	if i := strings.LastIndexByte(recipient, '@'); i >= 0 {
		return recipient[i+1:]
	}
	return ""
}

// checkRecipient validates "actor@node".
func checkRecipient(r string) error {
	if r == "" {
		return ErrNoRecipient
	}
	i := strings.LastIndexByte(r, '@')
	if i <= 0 || i == len(r)-1 || len(r) > maxRecipientLen || strings.IndexByte(r, 0) >= 0 {
		return fmt.Errorf("%w: %q", ErrBadRecipient, r)
	}
	return nil
}

// Record values in q/<recipient> are an 8-byte big-endian first_enqueued
// (unix ms) followed by the marshalled StoredMessage, so the committer can
// track the oldest message's age without decoding it.
func enqueuedMs(v []byte) int64 {
	if len(v) < 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v))
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

func u64(v uint64) []byte { return seqKey(v) }

// expiredAt reports whether env has expired at nowMs.
func expiredAt(env *pb.Envelope, nowMs int64) bool {
	return env.GetExpiresAtUnixMs() != 0 && env.GetExpiresAtUnixMs() <= nowMs
}

// farFuture is used for sendAt values that mean "never on its own".
const farFuture = math.MaxInt64

// submit hands o to the committer and waits for its commit.
func (s *Store) submit(ctx context.Context, o *op) error {
	if err := s.closedErr(); err != nil {
		return err
	}
	o.done = make(chan struct{})
	select {
	case s.ops <- o:
	case <-s.closing:
		return ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("outbox: %s: %w", o.kind, ctx.Err())
	}
	select {
	case <-o.done:
		return nil
	case <-s.stopped:
		select {
		case <-o.done:
			return nil
		default:
			return ErrClosed
		}
	case <-ctx.Done():
		// The operation may still commit; callers of reliable sends retry
		// with the same idempotency key, which the receiver deduplicates.
		return fmt.Errorf("outbox: %s: %w (may still commit)", o.kind, ctx.Err())
	}
}

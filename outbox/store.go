package outbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/storecheck"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/meshnode/meshnode/internal/address"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// Bucket and key names. See doc.go for the layout.
var (
	bucketQueues   = []byte("q") // format 2's queues, a bucket each: migrated at Open
	bucketRecords  = []byte("m")
	bucketOut      = []byte("out")
	bucketExpiry   = []byte("exp")
	bucketCoalesce = []byte("coalesce")
	bucketDLQ      = []byte("dlq")
	bucketIn       = []byte("in")
	bucketInDigest = []byte("indigest")
	bucketKeys     = []byte("keys")
	bucketKeyAge   = []byte("keyage")
	bucketForgot   = []byte("forgot")
	bucketMeta     = []byte("meta")

	keyFormat    = []byte("format")
	keySeqHigh   = []byte("seq")
	keyOutboxID  = []byte("outbox_id")
	keyClock     = []byte("clock")
	keyBoot      = []byte("boot")      // the boot the clock's checkpoint was taken in
	keyForwarded = []byte("forwarded") // MarkForwarding's mark
)

// formatVersion is the layout this code writes. Files without a format
// key were written by the first release (format 1), files of format 2 kept
// a bucket per queue; both are migrated at Open. A higher format is
// refused.
const formatVersion = 3

// MaxSequence is the highest sequence an outbox stores. ReserveSequence
// counts up from 1 and never gets near it; Enqueue refuses a sequence
// above it, and Open sets aside a record above it (a damaged file), so the
// sequences handed out after a restart, which continue above every stored
// one, never run out.
const MaxSequence = 1<<63 - 1

// maxRecipientLen bounds recipient names, which are stored in every queue
// record's header and in index keys.
const maxRecipientLen = 1024

// queue is the small in-memory state of one non-empty recipient queue. No
// message bodies live in memory: a million queued messages cost their
// queues' few bytes and about 4 bytes each for the queues' order.
type queue struct {
	name     string
	node     string
	seqs     seqList             // the sequences of its records, in order
	adds     [addHistory]addMark // the last commits that added to it (ring; omu)
	nAdds    int                 // commits that ever added to it
	headSeq  uint64              // sequence of the oldest message
	oldestMs int64               // created_elapsed_ms of the oldest message
	sendAt   int64               // elapsed ms; the recipient is due when sendAt <= now
}

// count returns how many messages the queue holds.
func (q *queue) count() int { return q.seqs.len() }

func lessQueue(a, b *queue) bool {
	if a.sendAt != b.sendAt {
		return a.sendAt < b.sendAt
	}
	return a.name < b.name
}

// Store is the durable outbox. All methods are safe for concurrent use.
type Store struct {
	cfg      Config
	db       *bolt.DB
	outboxID [16]byte
	clock    elapsed

	ops      chan *op
	closing  chan struct{} // closed by Close: the committer drains and exits
	stopped  chan struct{} // closed by the committer when it has exited
	closeMu  sync.Mutex
	isClosed bool

	onEnqueue atomic.Pointer[func(string)]
	onExpiry  atomic.Pointer[func(int64)]
	seqr      atomic.Pointer[Sequencer]

	// seqMu guards the fields below. It is held across the commit of a new
	// reservation, so callers wait for a durable high-water.
	seqMu       sync.Mutex
	nextSeq     uint64        // the next sequence to hand out
	handedOut   atomic.Uint64 // nextSeq as ReserveSequence left it; read without seqMu (HandedOutBelow)
	reservedSeq uint64        // durable: every sequence <= it may be handed out

	// markMu guards MarkForwarding's mark: forwardingRun, or the sequence
	// below which messages may have been forwarded; as the file holds it
	// (forwardedDisk), and as the store takes it (forwarded: forwardingRun
	// for a file restored from a backup, whatever it holds).
	markMu        sync.Mutex
	forwarded     uint64
	forwardedDisk uint64

	// mu guards the fields below. Lock order: mu before kmu; the committer
	// takes mu only after its transaction committed.
	mu       sync.RWMutex
	queues   map[string]*queue          // non-empty queues only
	byNode   map[string]*nodeQueues     // node -> its non-empty queues (due.go)
	nodes    *btree.BTreeG[*nodeQueues] // nodes not excluded with a queue, by their earliest send_at
	excluded map[string]struct{}        // nodes excluded by ExcludeNode, queued or not
	depth    int                        // sum of queues[*].count()
	dlqLen   int                        // records in the dlq bucket

	// omu guards the queues' order (queue.seqs, queue.adds) and the two
	// fields below; the committer changes queues (the map) holding both mu
	// and omu, so Head may read it under omu alone. A leaf lock: nothing
	// is waited for while it is held, so Head may take it inside a read
	// transaction.
	omu       sync.RWMutex
	appliedTx uint64         // the last commit whose effects are in memory
	pending   *pendingCommit // the commit between bbolt and applyEffects, or nil

	// kmu guards the field below: idempotency keys handed to the committer
	// and not yet committed, so a copy arriving meanwhile sees them.
	kmu         sync.Mutex
	pendingKeys map[string]int

	// asyncMu orders CommitStream's hand-off before Close: readers are
	// calls between their closed check and their send on ops, the writer
	// is Close closing s.closing. Lock order: closeMu before asyncMu.
	asyncMu sync.RWMutex

	// hkIn and hkCoalesce are where housekeeping resumes its scans of the
	// in and coalesce buckets. Owned by the committer; not thread-safe.
	hkIn, hkCoalesce []byte

	retries, deadLettered, expired, delivered, enqueued atomic.Uint64
	coalesced, superseded, fsyncs, commitFails          atomic.Uint64
	edits                                               atomic.Uint64 // Edits
	forgotten                                           atomic.Uint64 // Stats.StreamsForgotten
	// failed is set once, by the committer, when a commit failed after
	// bbolt wrote it: ErrFailed wrapping the disk's error (Err).
	failed atomic.Pointer[error]
}

// Open opens (creating if needed) the outbox file, migrates a file of an
// older format and rebuilds the in-memory indexes. If another process holds
// the file, Open fails with ErrLocked after cfg.LockTimeout. The file is
// checked before bbolt reads it (storecheck): a damaged file fails with
// ErrDamaged, a file that disappeared or was emptied with ErrLost, another
// store's file with ErrReplaced; each error says what to do.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err // reads "outbox: bad config: ..." already
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Logger = cfg.Logger.With("component", "outbox")
	if err := check(cfg); err != nil {
		return nil, err
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
	if err := faults.HookWrites(cfg.Path, db); err != nil {
		_ = db.Close()
		return nil, err
	}
	s := &Store{
		cfg:         cfg,
		db:          db,
		ops:         make(chan *op, cfg.QueueSize),
		closing:     make(chan struct{}),
		stopped:     make(chan struct{}),
		queues:      make(map[string]*queue),
		byNode:      make(map[string]*nodeQueues),
		nodes:       btree.NewG(32, lessNode),
		excluded:    make(map[string]struct{}),
		pendingKeys: make(map[string]int),
	}
	if err := s.upgradeQueues(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("outbox: open %s: migrate from format 2: %w", cfg.Path, err)
	}
	if err := s.load(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("outbox: open %s: %w", cfg.Path, err)
	}
	if err := db.View(func(tx *bolt.Tx) error {
		s.appliedTx = uint64(tx.ID())
		return nil
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("outbox: open %s: %w", cfg.Path, err)
	}
	if err := storecheck.Identify(cfg.Path, s.outboxID[:]); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("outbox: open %s: %w: put back this data directory's own outbox.db, or, to adopt this one, remove %s",
			cfg.Path, err, storecheck.IDPath(cfg.Path))
	}
	go s.run()
	return s, nil
}

// check looks at the file before bbolt is trusted with it (see Open).
func check(cfg Config) error {
	start := time.Now()
	o, err := storecheck.Before(cfg.Path, cfg.LockTimeout)
	dir := filepath.Dir(cfg.Path)
	switch {
	case errors.Is(err, storecheck.ErrBusy):
		return nil // bbolt's own lock reports it, as ErrLocked
	case errors.Is(err, storecheck.ErrDamaged):
		return fmt.Errorf("outbox: open %s: %w: do not start on it; stop the node and run `meshnode doctor --data-dir %s --salvage` to copy what is readable into a new file (the damaged one is kept beside it)",
			cfg.Path, err, dir)
	case errors.Is(err, storecheck.ErrLost):
		return fmt.Errorf("outbox: open %s: %w: its queued messages would be gone; run `meshnode doctor --data-dir %s --forget` to start with an empty outbox (new streams at every peer), or restore the file alone from a backup, keeping %s (its queued messages come back, and those delivered after the backup may run again; with an older %s, a peer may take new messages for copies of ones sent after the backup and drop them)",
			cfg.Path, err, dir, storecheck.HighPath(cfg.Path), filepath.Base(storecheck.HighPath(cfg.Path)))
	case err != nil:
		return fmt.Errorf("outbox: open %s: %w", cfg.Path, err)
	}
	if !o.New && !o.Clean {
		cfg.Logger.Warn("outbox: the last run did not close the store cleanly: checked it page by page",
			"pages", o.Report.Pages, "keys", o.Report.Keys, "took", time.Since(start).Round(time.Millisecond).String())
	}
	return nil
}

// load creates the buckets, migrates an old layout and rebuilds every
// in-memory index.
func (s *Store) load() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return fmt.Errorf("create bucket meta: %w", err)
		}
		var down time.Duration
		var exact bool
		s.clock, down, exact = resume(s.cfg.Clock, meta.Get(keyClock), meta.Get(keyBoot), s.cfg.MaxDowntime)
		if !exact && down > s.cfg.MaxDowntime {
			// Either the wall clock stepped, or the node really was off
			// that long: ages count only MaxDowntime of it. If it really
			// was, a message sent before the stop whose receipt was lost
			// may run again at a receiver that forgot the stream meanwhile.
			s.cfg.Logger.Warn("outbox: the wall clock says the store was closed longer than MaxDowntime; counting only MaxDowntime of it in message ages",
				"wall_clock_gap", down.Round(time.Second).String(), "counted", s.cfg.MaxDowntime.String())
		}
		format := uint64(1)
		if v := meta.Get(keyFormat); len(v) == 8 {
			format = binary.BigEndian.Uint64(v)
		} else if tx.Bucket(bucketQueues) == nil && tx.Bucket(bucketRecords) == nil {
			format = formatVersion // a new file
		}
		if format > formatVersion {
			return fmt.Errorf("%w: format %d is newer than this meshnode's %d: run the newer meshnode, or move the data directory aside to start empty",
				ErrFormat, format, formatVersion)
		}
		for _, name := range [][]byte{bucketRecords, bucketOut, bucketExpiry, bucketCoalesce, bucketDLQ, bucketIn, bucketInDigest, bucketKeys, bucketKeyAge, bucketForgot} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		// Counted before anything in this transaction adds to it (bbolt's
		// Stats reads pages, not the transaction's changes): the
		// migration and loadQueues count what they add.
		s.dlqLen = tx.Bucket(bucketDLQ).Stats().KeyN
		if format < 2 {
			// The first format kept no elapsed clock, so it would start at
			// zero and the migrated messages and keys, stored up to MaxAge
			// or KeyWindow ago, would get negative times: the expiry and
			// key-age indexes, ordered by their unsigned bytes, would sort
			// them last, where the sweeper and the pruning never look.
			s.clock.base = max(s.clock.base, max(s.cfg.MaxAge(), s.cfg.KeyWindow).Milliseconds()+1)
			if err := s.migrate(tx); err != nil {
				return fmt.Errorf("migrate from format %d: %w", format, err)
			}
		}

		if err := meta.Put(keyFormat, u64(formatVersion)); err != nil {
			return err
		}
		if v := meta.Get(keyOutboxID); len(v) == len(s.outboxID) {
			copy(s.outboxID[:], v)
		} else {
			if _, err := rand.Read(s.outboxID[:]); err != nil {
				return fmt.Errorf("make outbox id: %w", err)
			}
			if err := meta.Put(keyOutboxID, s.outboxID[:]); err != nil {
				return err
			}
		}
		var high uint64
		if v := meta.Get(keySeqHigh); len(v) == 8 {
			high = binary.BigEndian.Uint64(v)
		}
		if v := meta.Get(keyForwarded); len(v) == 8 {
			s.forwarded = binary.BigEndian.Uint64(v)
			s.forwardedDisk = s.forwarded
		}
		if err := s.loadQueues(tx, &high); err != nil {
			return err
		}
		// The record beside the file survives the file's restore from a
		// backup: sequences handed out since the backup, which peers may
		// have run, are not handed out again for other messages.
		beside, err := storecheck.ReadHigh(s.cfg.Path)
		if err != nil {
			return err
		}
		if beside > high {
			// What the file does not hold may have been forwarded too:
			// count everything in it as possibly forwarded.
			s.forwarded = forwardingRun
			s.cfg.Logger.Info("outbox: continuing sequences above the high-water recorded beside the file, which is above the file's own (a crash while reserving, or the file was restored from a backup)",
				"file", high, "beside", beside)
			high = beside
		}
		if high >= MaxSequence {
			return fmt.Errorf("%w: the sequence high-water %d (the file's, or the one recorded in %s) leaves no sequence to hand out below MaxSequence",
				ErrCorrupt, high, storecheck.HighPath(s.cfg.Path))
		}
		// Sequences handed out before a crash may have been used up to the
		// reserved high-water: start above it.
		s.nextSeq, s.reservedSeq = high+1, high
		s.handedOut.Store(s.nextSeq)
		return putClock(meta, s.clock)
	})
}

// loadQueues rebuilds the queue index from the file, in one scan of the
// records in sequence order; high is raised to the highest stored
// sequence.
func (s *Store) loadQueues(tx *bolt.Tx, high *uint64) error {
	now := s.clock.nowMs()
	out := tx.Bucket(bucketOut)
	c := tx.Bucket(bucketRecords).Cursor()
	byName := make(map[string]*queue)
	var order []*queue
	var bad [][]byte // keys of records whose header names no queue
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) == 8 && seqOf(k) <= MaxSequence {
			*high = max(*high, seqOf(k)) // never handed out again, queued or not
		}
		name := recRecipient(v)
		if len(k) != 8 || name == nil || seqOf(k) > MaxSequence {
			bad = append(bad, bytes.Clone(k))
			continue
		}
		st := byName[string(name)]
		if st == nil {
			r := string(name)
			if checkRecipient(r) != nil {
				bad = append(bad, bytes.Clone(k))
				continue
			}
			st = &queue{name: r, node: address.Node(r), headSeq: seqOf(k), oldestMs: createdMs(v), sendAt: now}
			if os, err := decodeOutStream(out.Get(name)); err == nil && os.GetSendAtElapsedMs() > now {
				st.sendAt = os.GetSendAtElapsedMs()
			}
			byName[r] = st
			order = append(order, st)
		}
		st.seqs.add(seqOf(k)) // in key order: appended
	}
	for _, st := range order {
		s.insertQueue(st)
	}
	return s.setAside(tx, bad)
}

// setAside moves the records under keys, whose headers name no queue or
// whose sequences are above MaxSequence (a damaged file), into the
// dead-letter queue, where an operator sees them.
func (s *Store) setAside(tx *bolt.Tx, keys [][]byte) error {
	if len(keys) == 0 {
		return nil
	}
	recs := tx.Bucket(bucketRecords)
	b := &batch{nowMs: s.clock.nowMs(), wallMs: s.cfg.Clock.Now().UnixMilli(), q: make(map[string]*qdelta)}
	for _, k := range keys {
		sm, err := decodeRecord(recs.Get(k))
		if err != nil {
			sm = &pb.StoredMessage{Envelope: &pb.Envelope{}}
		}
		reason := fmt.Sprintf("undecodable: record %x: its header names no queue, or its sequence is above MaxSequence", k)
		sm.LastError = reason
		if err := s.putDeadLetter(tx, b, sm, reason); err != nil {
			return err
		}
		if err := recs.Delete(k); err != nil {
			return err
		}
		s.dlqLen++
	}
	s.cfg.Logger.Error("outbox: queued records whose header names no queue were moved to the dead-letter queue", "records", len(keys))
	return nil
}

// OutboxID returns the random id made with this outbox file: the sender
// part of every stream it feeds. A wiped data directory gets a new one, so
// receivers see new streams rather than a sender whose numbers went back.
func (s *Store) OutboxID() [16]byte { return s.outboxID }

// ElapsedMs returns the store's elapsed clock in milliseconds: time the
// store was open at the monotonic rate, plus closed time as the wall clock
// tells it within MaxDowntime. Ages, TTLs and deferrals are measured on it.
func (s *Store) ElapsedMs() int64 { return s.clock.nowMs() }

// HandedOutBelow returns a bound under which every sequence that
// ReserveSequence has returned so far lies; any later one is at or above
// it.
func (s *Store) HandedOutBelow() uint64 { return s.handedOut.Load() }

// Edits counts the commits that changed a queue other than by appending
// a message or removing an acknowledged one: a coalescing replacement, a
// failed attempt recorded, an expiry or dead-lettering, a replay, a
// dropped recipient. It is odd from before such a commit can be seen by
// Head until after it has ended. A caller that read a queue ahead with
// Head, below every sequence that could still commit (HandedOutBelow, and
// the first of its own still being stored), and finds Edits even and
// unchanged since before that read, knows that a Head now would return
// the same messages first, less those acknowledged since.
func (s *Store) Edits() uint64 { return s.edits.Load() }

// Config returns the configuration the store was opened with.
func (s *Store) Config() Config { return s.cfg }

// Close stops the committer after it has committed every operation already
// queued, then closes the file. The first call returns the file's close
// error; later calls return ErrClosed.
func (s *Store) Close() error { return s.shut(true) }

// Abandon closes the store as a crash would leave it, without the mark of
// a clean shutdown, so that the next Open checks the whole file. For fault
// injection (node.Kill); everything acknowledged was already fsynced.
func (s *Store) Abandon() error { return s.shut(false) }

// shut stops the committer, closes the file and, when clean, marks the
// shutdown clean (never after a failed sync: the next Open checks the
// whole file).
func (s *Store) shut(clean bool) error {
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
	if !clean || s.Err() != nil {
		return nil
	}
	if err := storecheck.MarkClean(s.cfg.Path); err != nil {
		return fmt.Errorf("outbox: close: %w", err)
	}
	return nil
}

// ReserveSequence returns a new sequence: greater than every sequence this
// outbox handed out before, across restarts, whatever the clocks do, and
// across a restore of its file from a backup while outbox.db.seq beside it
// is kept. The high-water covering it is durable in the file (and beside
// it, unless the disk refused that write, which is logged) before it is
// returned (reserved in blocks of Config.SequenceBlock, so one fsync
// serves many calls).
//
// A block starts no lower than the wall clock in microseconds since 1970
// (clockFloor), and with the clock set it is at most maxClockBlock long.
// An outbox hands out far fewer than a million sequences a second, so its
// sequences stay below the clock but for what a start skips (the rest of
// the block reserved before it: at most maxClockBlock microseconds ahead,
// for each start less than that after the one before). So one restored
// from a backup together with the record beside it, once the clock is
// later than it read while the outbox last ran (by that skip), still hands
// out sequences above every one handed out before the restore, and its new
// messages are never taken by their receivers for copies of messages that
// ran. A clock that is behind (a device without a battery-backed clock,
// before its first time sync, or one that ran fast and was set back)
// leaves the counter as it is.
func (s *Store) ReserveSequence() (uint64, error) {
	if err := s.usableErr(); err != nil {
		return 0, fmt.Errorf("outbox: reserve sequences: %w", err)
	}
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	if s.nextSeq > s.reservedSeq {
		block := s.cfg.SequenceBlock
		if f := clockFloor(s.cfg.Clock); f > 0 {
			s.nextSeq = max(s.nextSeq, f)
			block = min(block, maxClockBlock)
		}
		o := &op{kind: opReserve, seq: s.nextSeq + block - 1}
		// Beside the file first: a high-water recorded there and not in
		// the file only skips a block. A record that cannot be written
		// (a full disk can refuse a new file where bbolt still finds free
		// pages) stops no send: only a restore of the file from a backup
		// taken before this block could then hand out its sequences again.
		if err := storecheck.RecordHigh(s.cfg.Path, o.seq); err != nil {
			s.cfg.Logger.Warn("outbox: sequence high-water not recorded beside the file; a restore of outbox.db from a backup could reuse this block's sequences", "high", o.seq, "err", err)
		}
		if err := s.submit(context.Background(), o); err != nil {
			return 0, fmt.Errorf("outbox: reserve sequences: %w", err)
		}
		if o.err != nil {
			return 0, fmt.Errorf("outbox: reserve sequences: %w", o.err)
		}
		s.reservedSeq = o.seq
	}
	seq := s.nextSeq
	s.nextSeq++
	s.handedOut.Store(s.nextSeq)
	return seq, nil
}

// forwardingRun is MarkForwarding's mark while a run that may forward is
// the last one made.
const forwardingRun = math.MaxUint64

// MarkForwarding records durably whether the run of the relay being made
// over this outbox may send its messages through forwarders, and returns
// the sequence below which a stored message may have been sent through
// one, by this run or an earlier one, with no answer: a forwarder may
// still hold that copy, which runs when it arrives, so a later verdict on
// another copy does not say the message never ran. With forwards, that is
// every message stored before the call (the relay keeps track of the
// copies it forwards itself); without, every message stored before the
// end of the last run that forwarded, however many runs came since (0 if
// none ever did). Call it once per run, before anything is sent.
func (s *Store) MarkForwarding(forwards bool) (below uint64, err error) {
	s.markMu.Lock()
	defer s.markMu.Unlock()
	if !forwards && s.forwarded != forwardingRun {
		return s.forwarded, nil
	}
	below, err = s.ReserveSequence() // above every message stored so far
	if err != nil {
		return 0, fmt.Errorf("outbox: mark forwarding: %w", err)
	}
	mark := below
	if forwards {
		mark = forwardingRun
	}
	if mark != s.forwardedDisk {
		o := &op{kind: opForwarding, seq: mark}
		if err := s.submit(context.Background(), o); err != nil {
			return 0, fmt.Errorf("outbox: mark forwarding: %w", err)
		}
		if o.err != nil {
			return 0, fmt.Errorf("outbox: mark forwarding: %w", o.err)
		}
		s.forwardedDisk = mark
	}
	s.forwarded = mark
	return below, nil
}

// maxClockFloor bounds clockFloor: a wall clock set absurdly far ahead
// (past the year 70,000) starts no block near MaxSequence, so such a
// clock cannot use up the sequences.
const maxClockFloor = MaxSequence / 4

// maxClockBlock bounds a block reserved with the clock set: about 65 ms of
// microseconds, so a restart skips at most that far ahead of the clock (a
// larger Config.SequenceBlock only saves fsyncs with the clock not set).
const maxClockBlock = 1 << 16

// clockFloor returns the wall clock in microseconds since 1970, the
// lowest sequence a newly reserved block starts at; 0 (no floor) for a
// clock before 1970 or past maxClockFloor.
func clockFloor(c Clock) uint64 {
	us := c.Now().UnixMicro()
	if us <= 0 || uint64(us) > maxClockFloor {
		return 0
	}
	return uint64(us)
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

// SetOnExpiry installs the relay's sweeper hook: after a commit that stored
// messages with a TTL, and before its callers return (or their done
// callbacks run), it is called with the earliest TTL deadline among them
// (elapsed ms). It must not block.
func (s *Store) SetOnExpiry(f func(deadlineMs int64)) {
	if f == nil {
		s.onExpiry.Store(nil)
		return
	}
	s.onExpiry.Store(&f)
}

// Pending returns how many messages wait for recipient (O(1), in memory).
func (s *Store) Pending(recipient string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if st := s.queues[recipient]; st != nil {
		return st.count()
	}
	return 0
}

// PendingExcept returns how many messages are queued for recipient
// besides those of skip (ascending): a sequence of skip that is no longer
// queued (acked, replaced, given up) is not subtracted twice. It reads
// memory only.
func (s *Store) PendingExcept(recipient string, skip []uint64) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	q := s.queues[recipient]
	if q == nil {
		return 0
	}
	return q.count() - q.seqs.countIn(skip)
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

// Err returns why the store stopped taking writes (ErrFailed wrapping the
// disk's error), or nil while it takes them.
func (s *Store) Err() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// usableErr is closedErr, or the failure that stopped the store.
func (s *Store) usableErr() error {
	if err := s.closedErr(); err != nil {
		return err
	}
	return s.Err()
}

// checkRecipient validates "actor@node".
func checkRecipient(r string) error {
	if r == "" {
		return ErrNoRecipient
	}
	actor, node, ok := address.Split(r)
	if !ok || actor == "" || node == "" || len(r) > maxRecipientLen || strings.IndexByte(r, 0) >= 0 {
		return fmt.Errorf("%w: %q", ErrBadRecipient, r)
	}
	return nil
}

// Queue records (values in the records bucket, keyed by sequence) start
// with a header so the committer can maintain the indexes, and Open
// rebuild the queues, without decoding the message:
//
//	[0:8]   created_elapsed_ms, big-endian
//	[8:16]  TTL deadline (elapsed ms) when the message has a TTL, else 0
//	[16]    flags: flagCoalesce = the coalesce index points at this record
//	[17:19] length of the recipient, big-endian
//	[19:]   the recipient, then the marshalled StoredMessage
//
// Format 2's records had the first 17 bytes only (the recipient was their
// bucket's name).
const (
	recFixed     = 19
	flagCoalesce = 1
)

func createdMs(v []byte) int64 {
	if len(v) < 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v))
}

func deadlineMs(v []byte) int64 {
	if len(v) < 16 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v[8:16]))
}

func recFlags(v []byte) byte {
	if len(v) < recFixed {
		return 0
	}
	return v[16]
}

// recHeaderLen returns the length of v's header; more than len(v) when v
// is damaged.
func recHeaderLen(v []byte) int {
	if len(v) < recFixed {
		return recFixed
	}
	return recFixed + int(binary.BigEndian.Uint16(v[17:19]))
}

// recRecipient returns the recipient in v's header (nil when v is too
// short to hold it).
func recRecipient(v []byte) []byte {
	n := recHeaderLen(v)
	if n > len(v) {
		return nil
	}
	return v[recFixed:n]
}

// ofRecipient reports whether record v belongs to r's queue.
func ofRecipient(v []byte, r string) bool {
	return v != nil && string(recRecipient(v)) == r
}

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

func seqOf(k []byte) uint64 {
	if len(k) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(k[:8])
}

func u64(v uint64) []byte { return seqKey(v) }

// submit hands o to the committer and waits for its commit.
func (s *Store) submit(ctx context.Context, o *op) error {
	if err := s.usableErr(); err != nil {
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
		// The operation may still commit; a reliable send that gives up
		// here may still be delivered.
		return fmt.Errorf("outbox: %s: %w (may still commit)", o.kind, ctx.Err())
	}
}

// submitAsync hands o to the committer without waiting; o.async is called
// after the commit (or with ErrClosed at once when the store is closed).
func (s *Store) submitAsync(o *op) {
	// asyncMu (read) keeps Close from closing s.closing between the check
	// and the send, so an op that made it into s.ops is always committed
	// by the committer's final drain and its callback always runs.
	s.asyncMu.RLock()
	defer s.asyncMu.RUnlock()
	if err := s.usableErr(); err != nil {
		s.forgetPendingKeys([]*op{o}) // nothing of o is stored: its keys are not seen
		o.async(fmt.Errorf("outbox: %s: %w", o.kind, err))
		return
	}
	s.ops <- o // the committer runs until s.closing, which needs asyncMu
}

// putClock writes the elapsed clock's checkpoint into meta.
func putClock(meta *bolt.Bucket, e elapsed) error {
	clock, boot := e.checkpoint()
	if err := meta.Put(keyClock, clock); err != nil {
		return err
	}
	if boot == nil {
		return meta.Delete(keyBoot)
	}
	return meta.Put(keyBoot, boot)
}

package inbox

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/storecheck"
	"github.com/meshnode/meshnode/mailbox/pb"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

var (
	bucketInboxes = []byte("inboxes") // name -> declared-at unix ms
	prefixQueue   = "q/"              // q/<name>: big-endian cursor -> pb.Envelope (event_seq = cursor)
	bucketMeta    = []byte("meta")    // keyStoreID -> 16 random bytes made with the file
	keyStoreID    = []byte("store_id")
	bucketStreams = []byte("streams") // stream key -> big-endian sequence and cursor of its last stored message (Mark)
)

// Mark places a reliable stream message: its stream's key
// (outbox.StreamKey) and its sequence. The inbox keeps, in the same commit
// as the messages, the highest sequence it stored of each stream, and
// stores a marked message at or below it only once: a receiver that dies
// after storing messages and before their watermark is committed gets
// them again (under new msg ids), and they must not be stored a second
// time, behind newer ones. A zero Mark (tell, ask) is stored as it comes.
type Mark struct {
	Stream []byte
	Seq    uint64
}

// Applied returns the highest sequence of stream (its outbox.StreamKey)
// stored in any inbox, 0 when none was, the file cannot be read or the
// store stopped after a failed sync (the node's own watermark then
// stands).
func (s *Store) Applied(stream []byte) uint64 {
	if s.Err() != nil {
		return 0 // the file's word is not trusted after a failed sync
	}
	var m streamMark
	_ = s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketStreams); b != nil {
			m = readMark(b, stream)
		}
		return nil
	})
	return m.seq
}

// streamMark is a stream's record in bucketStreams.
type streamMark struct{ seq, cursor uint64 }

func readMark(b *bolt.Bucket, stream []byte) streamMark {
	v := b.Get(stream)
	if len(v) != 16 {
		return streamMark{}
	}
	return streamMark{binary.BigEndian.Uint64(v[:8]), binary.BigEndian.Uint64(v[8:])}
}

func putMark(b *bolt.Bucket, stream []byte, m streamMark) error {
	var v [16]byte
	binary.BigEndian.PutUint64(v[:8], m.seq)
	binary.BigEndian.PutUint64(v[8:], m.cursor)
	return b.Put(stream, v[:])
}

// Store is the durable inbox of a daemon: named queues of envelopes with a
// monotonic cursor each. All methods are safe for concurrent use.
type Store struct {
	cfg  Config
	db   *bolt.DB
	done chan struct{} // closed by Close: wakes long polls

	// wmu serializes write transactions (bbolt does too), so that after a
	// failed commit the file's transaction says whether it was written.
	wmu sync.Mutex
	// failed is set once, when the disk failed a commit bbolt had already
	// written: ErrFailed wrapping the disk's error (Err).
	failed atomic.Pointer[error]

	// gmu guards the appends waiting to share a commit (group).
	gmu      sync.Mutex
	gqueue   []*groupCall
	grunning bool // a caller is committing; the next one queued leads after it

	closeOnce sync.Once

	// mu guards the fields below.
	mu     sync.Mutex
	boxes  map[string]*box
	closed bool
}

// box is the in-memory state of one inbox; it holds no message bodies.
type box struct {
	count  int           // stored (unacknowledged) messages
	held   int           // slots reserved by appends in progress, so that they cannot overshoot the bound together
	last   uint64        // highest committed cursor
	acked  uint64        // highest acknowledged cursor this run
	notify chan struct{} // closed and replaced when a message is committed
}

// Stats describes one inbox.
type Stats struct {
	Depth      int    // unacknowledged messages stored
	LastCursor uint64 // cursor of the newest stored message (0: none yet)
	AckedTo    uint64 // highest cursor acknowledged since the store opened
}

// Open opens (creating if needed) the inbox file. Another process holding
// it gives ErrLocked after cfg.LockTimeout. The file is checked before
// bbolt reads it: a damaged file gives ErrDamaged, one that disappeared or
// was emptied ErrLost, another inbox's file ErrReplaced; each error says
// what to do.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir := filepath.Dir(cfg.Path)
	switch _, err := storecheck.Before(cfg.Path, cfg.LockTimeout); {
	case errors.Is(err, storecheck.ErrBusy):
		// bbolt's own lock reports it, as ErrLocked
	case errors.Is(err, storecheck.ErrDamaged):
		return nil, fmt.Errorf("inbox: open %s: %w: do not start on it; run `meshnode doctor --data-dir %s --salvage` to copy what is readable into a new file (the damaged one is kept beside it)",
			cfg.Path, err, dir)
	case errors.Is(err, storecheck.ErrLost):
		return nil, fmt.Errorf("inbox: open %s: %w: its unacknowledged messages would be gone; restore the file from a backup, or run `meshnode doctor --data-dir %s --forget` to start with an empty inbox",
			cfg.Path, err, dir)
	case err != nil:
		return nil, fmt.Errorf("inbox: open %s: %w", cfg.Path, err)
	}
	db, err := bolt.Open(cfg.Path, 0o600, &bolt.Options{Timeout: cfg.LockTimeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("inbox: open %s: %w (stop the other meshnode or use another data directory)", cfg.Path, ErrLocked)
		}
		return nil, fmt.Errorf("inbox: open %s: %w", cfg.Path, err)
	}
	if err := faults.HookWrites(cfg.Path, db); err != nil {
		_ = db.Close()
		return nil, err
	}
	s := &Store{cfg: cfg, db: db, done: make(chan struct{}), boxes: make(map[string]*box)}
	var id []byte
	err = s.update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if id = meta.Get(keyStoreID); len(id) != 16 {
			id = make([]byte, 16)
			_, _ = rand.Read(id) // crypto/rand.Read never fails (Go >= 1.24 aborts instead)
			if err := meta.Put(keyStoreID, id); err != nil {
				return err
			}
		}
		id = append([]byte(nil), id...)
		if _, err := tx.CreateBucketIfNotExists(bucketStreams); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(bucketInboxes)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, _ []byte) error {
			name := string(k)
			q, err := tx.CreateBucketIfNotExists([]byte(prefixQueue + name))
			if err != nil {
				return err
			}
			s.boxes[name] = &box{count: q.Stats().KeyN, last: q.Sequence(), notify: make(chan struct{})}
			return nil
		})
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("inbox: load %s: %w", cfg.Path, err)
	}
	if err := storecheck.Identify(cfg.Path, id); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("inbox: open %s: %w: put back this data directory's own inbox.db, or, to adopt this one, remove %s",
			cfg.Path, err, storecheck.IDPath(cfg.Path))
	}
	return s, nil
}

// update runs fn in a write transaction. When the commit fails after
// bbolt wrote its meta page (its fsync failing), the file shows the
// commit while the disk may not keep it, and a later fsync that succeeds
// says nothing of what this one lost: the store stops (Err).
func (s *Store) update(fn func(*bolt.Tx) error) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.Err(); err != nil {
		return err
	}
	var txid int
	err := s.db.Update(func(tx *bolt.Tx) error {
		txid = tx.ID()
		return fn(tx)
	})
	if err == nil || txid == 0 {
		return err
	}
	written := false
	_ = s.db.View(func(tx *bolt.Tx) error {
		written = tx.ID() >= txid
		return nil
	})
	if !written {
		return err
	}
	err = fmt.Errorf("%w: %w", ErrFailed, err)
	s.failed.Store(&err)
	s.mu.Lock()
	for _, b := range s.boxes {
		close(b.notify) // waiting pulls return the failure
		b.notify = make(chan struct{})
	}
	s.mu.Unlock()
	return err
}

// Err returns why the store stopped (ErrFailed wrapping the disk's
// error), or nil while it works.
func (s *Store) Err() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Close releases the file and ends pending long polls. Idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.done)
		// Under wmu: a write that failed has learnt whether bbolt wrote
		// it (update) before the file closes.
		s.wmu.Lock()
		cerr := s.db.Close()
		s.wmu.Unlock()
		if cerr == nil && s.Err() == nil {
			// Clean, unless a sync failed: then the next Open checks the
			// whole file.
			cerr = storecheck.MarkClean(s.cfg.Path)
		}
		if cerr != nil {
			err = fmt.Errorf("inbox: close: %w", cerr)
		}
	})
	return err
}

// ValidName checks an inbox name: 1-255 ASCII letters, digits, '-', '_',
// '.' and ':', not only dots, and not a name Windows reserves for a device
// (CON, PRN, AUX, NUL, COM0-9, LPT0-9, with or without an extension). An
// inbox name is an actor name, a key in the file and a word operators read
// and may use in file names: a path ("..", "a\\b"), text that reorders
// itself on screen (U+202E) or a device must not pass as one.
func ValidName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrBadName)
	case len(name) > 255:
		return fmt.Errorf("%w: %+q is longer than 255 bytes", ErrBadName, name[:32]+"...")
	case strings.ContainsFunc(name, func(r rune) bool { return !nameRune(r) }):
		return fmt.Errorf("%w: %+q: use ASCII letters, digits, '-', '_', '.' or ':'", ErrBadName, name)
	case strings.Trim(name, ".") == "":
		return fmt.Errorf("%w: %q is only dots", ErrBadName, name)
	case windowsDevice(name):
		return fmt.Errorf("%w: %q is a device name on Windows", ErrBadName, name)
	}
	return nil
}

func nameRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == ':'
}

// windowsDevice reports CON, PRN, AUX, NUL, COM0-9 and LPT0-9 in any case,
// alone or before a dot.
func windowsDevice(name string) bool {
	base, _, _ := strings.Cut(strings.ToUpper(name), ".")
	switch base {
	case "CON", "PRN", "AUX", "NUL":
		return true
	}
	return len(base) == 4 && (strings.HasPrefix(base, "COM") || strings.HasPrefix(base, "LPT")) && base[3] >= '0' && base[3] <= '9'
}

// Declare creates the inbox name durably (idempotent); created reports
// whether it is new.
func (s *Store) Declare(name string) (created bool, err error) {
	s.mu.Lock()
	_, exists := s.boxes[name]
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return false, ErrClosed
	}
	if exists {
		return false, nil // declared before: also a name an older release accepted
	}
	if err := ValidName(name); err != nil {
		return false, err
	}
	err = s.update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists([]byte(prefixQueue + name)); err != nil {
			return err
		}
		return tx.Bucket(bucketInboxes).Put([]byte(name), be(uint64(time.Now().UnixMilli())))
	})
	if err != nil {
		return false, fmt.Errorf("inbox: declare %q: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.boxes[name]; ok {
		return false, nil
	}
	s.boxes[name] = &box{notify: make(chan struct{})}
	return true, nil
}

// Inboxes returns the declared inbox names, sorted.
func (s *Store) Inboxes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.boxes))
	for n := range s.boxes {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Stats returns the state of every inbox.
func (s *Store) Stats() map[string]Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Stats, len(s.boxes))
	for n, b := range s.boxes {
		out[n] = Stats{Depth: b.count, LastCursor: b.last, AckedTo: b.acked}
	}
	return out
}

// Append stores a copy of env in inbox name with the next cursor (set as
// its event_seq) and returns once it is fsynced; concurrent appends share
// one commit. A full inbox gives ErrFull; nothing is stored then.
func (s *Store) Append(ctx context.Context, name string, env *pb.Envelope) (uint64, error) {
	return s.AppendMarked(ctx, name, env, Mark{})
}

// AppendMarked is Append for a message placed by mark. A message its
// stream already stored (its sequence at or below the stream's last) is
// not stored again; the cursor is then the one the stream's last message
// got if mark is that message, else 0.
func (s *Store) AppendMarked(ctx context.Context, name string, env *pb.Envelope, mark Mark) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("inbox: append to %q: %w", name, err)
	}
	s.mu.Lock()
	b, ok := s.boxes[name]
	switch {
	case s.closed:
		s.mu.Unlock()
		return 0, ErrClosed
	case !ok:
		s.mu.Unlock()
		return 0, fmt.Errorf("inbox: append to %q: %w", name, ErrNoSuchInbox)
	case b.count+b.held >= s.cfg.MaxMessages:
		count := b.count + b.held
		s.mu.Unlock()
		return 0, fmt.Errorf("inbox: append to %q: %w (%d unacknowledged messages, or being stored)", name, ErrFull, count)
	}
	b.held++
	s.mu.Unlock()

	msg := proto.CloneOf(env)
	var cursor uint64
	var seen bool
	err := s.group(func(tx *bolt.Tx) error {
		cursor, seen = 0, false // it may run again, without a call that failed
		if err := faults.CommitError(s.cfg.Path); err != nil {
			return err // a test's full disk
		}
		q := tx.Bucket([]byte(prefixQueue + name))
		if q == nil {
			return ErrNoSuchInbox
		}
		sb := tx.Bucket(bucketStreams)
		if mark.Stream != nil {
			if m := readMark(sb, mark.Stream); mark.Seq <= m.seq {
				if mark.Seq == m.seq {
					cursor = m.cursor
				}
				seen = true
				return nil
			}
		}
		seq, err := q.NextSequence()
		if err != nil {
			return err
		}
		msg.EventSeq = seq
		data, err := proto.Marshal(msg)
		if err != nil {
			return encodeError{err}
		}
		cursor = seq
		if err := q.Put(be(seq), data); err != nil {
			return err
		}
		if mark.Stream != nil {
			return putMark(sb, mark.Stream, streamMark{mark.Seq, seq})
		}
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	b.held--
	if err == nil && !seen {
		b.count++
	}
	if err != nil {
		return 0, appendError(name, err)
	}
	if seen {
		return cursor, nil
	}
	if cursor > b.last {
		b.last = cursor
		close(b.notify)
		b.notify = make(chan struct{})
	}
	return cursor, nil
}

// encodeError is a message Append could not encode: its own fault, not the
// file's.
type encodeError struct{ err error }

func (e encodeError) Error() string { return "encode: " + e.err.Error() }
func (e encodeError) Unwrap() error { return e.err }

// appendError is the error of an append to inbox name whose write
// transaction failed with err: ErrClosed once the file is closed, the
// inbox's own refusals as they are, and anything else, which the file
// refused (a full or failing disk), as ErrWrite.
func appendError(name string, err error) error {
	var enc encodeError
	switch {
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return ErrClosed
	case errors.Is(err, ErrNoSuchInbox), errors.As(err, &enc):
		return fmt.Errorf("inbox: append to %q: %w", name, err)
	}
	return fmt.Errorf("inbox: append to %q: %w: %w", name, ErrWrite, err)
}

// AppendBatch stores copies of envs in inbox name, in order, in one commit
// (one fsync for all), and returns once they are durable. n reports how
// many, from the first, were stored, with cursors first, first+1, ...,
// first+n-1. When the inbox has room for only some, the first ones that fit
// are stored and err is ErrFull for envs[n:]; on any other error nothing is
// stored (n is 0). A program sees none of them before all are durable.
// AppendBatchMarked does the same for stream messages.
//
// It is the daemon's inbox actor's path: the actor takes every message
// waiting in its mailbox and hands them over at once, instead of paying a
// commit (and the group-commit delay) per message.
// appendFill is how full bbolt packs the queue's pages when it splits
// them. Keys only grow (NextSequence), so a page once left behind never
// takes another record: at bbolt's default of a half, every page written
// and kept would be half empty.
const appendFill = 1.0

func (s *Store) AppendBatch(ctx context.Context, name string, envs []*pb.Envelope) (first uint64, n int, err error) {
	return s.AppendBatchMarked(ctx, name, envs, nil)
}

// AppendBatchMarked is AppendBatch for messages placed by marks (one per
// envelope; nil, or a zero Mark, for none). A message its stream already
// stored is not stored again but counts in n as handled; the cursors of
// those stored are first, first+1, ... (first is 0 when none was).
func (s *Store) AppendBatchMarked(ctx context.Context, name string, envs []*pb.Envelope, marks []Mark) (first uint64, n int, err error) {
	if marks != nil && len(marks) != len(envs) {
		return 0, 0, fmt.Errorf("inbox: append to %q: %d marks for %d messages", name, len(marks), len(envs))
	}
	if len(envs) == 0 {
		return 0, 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, fmt.Errorf("inbox: append to %q: %w", name, err)
	}
	s.mu.Lock()
	b, ok := s.boxes[name]
	switch {
	case s.closed:
		s.mu.Unlock()
		return 0, 0, ErrClosed
	case !ok:
		s.mu.Unlock()
		return 0, 0, fmt.Errorf("inbox: append to %q: %w", name, ErrNoSuchInbox)
	case b.count+b.held >= s.cfg.MaxMessages:
		count := b.count + b.held
		s.mu.Unlock()
		return 0, 0, fmt.Errorf("inbox: append to %q: %w (%d unacknowledged messages, or being stored)", name, ErrFull, count)
	}
	n = min(len(envs), s.cfg.MaxMessages-b.count-b.held)
	b.held += n
	s.mu.Unlock()

	// The envelopes as they came, encoded before the write transaction so
	// that it only stores them. A buffer per message: bbolt keeps each
	// value until the commit.
	data := make([][]byte, n)
	for i, env := range envs[:n] {
		if data[i], err = envcodec.Marshal(env, cursorFieldLen); err != nil {
			s.mu.Lock()
			b.held -= n
			s.mu.Unlock()
			return 0, 0, fmt.Errorf("inbox: append to %q: %w", name, err)
		}
	}
	stored := 0
	err = s.update(func(tx *bolt.Tx) error {
		if err := faults.CommitError(s.cfg.Path); err != nil {
			return err // a test's full disk
		}
		q := tx.Bucket([]byte(prefixQueue + name))
		if q == nil {
			return ErrNoSuchInbox
		}
		q.FillPercent = appendFill
		sb := tx.Bucket(bucketStreams)
		var last map[string]streamMark // per stream in the batch: its last stored message
		var moved map[string]bool      // the streams whose last moved in this batch
		for i := range envs[:n] {
			var mk Mark
			if marks != nil {
				mk = marks[i]
			}
			if mk.Stream != nil {
				if last == nil {
					last = map[string]streamMark{}
				}
				m, ok := last[string(mk.Stream)]
				if !ok {
					m = readMark(sb, mk.Stream)
					last[string(mk.Stream)] = m
				}
				if mk.Seq <= m.seq {
					continue // stored before a crash lost its watermark
				}
			}
			seq, err := q.NextSequence()
			if err != nil {
				return err
			}
			if stored == 0 {
				first = seq
			}
			stored++
			if mk.Stream != nil {
				if moved == nil {
					moved = map[string]bool{}
				}
				last[string(mk.Stream)] = streamMark{mk.Seq, seq}
				moved[string(mk.Stream)] = true
			}
			// Then event_seq = cursor: the last occurrence of a scalar
			// field wins when it is read, so the caller's envelope is
			// neither cloned nor written to.
			v := protowire.AppendTag(data[i], eventSeqField, protowire.VarintType)
			v = protowire.AppendVarint(v, seq)
			if err := q.Put(be(seq), v); err != nil {
				return err
			}
		}
		for k := range moved {
			if err := putMark(sb, []byte(k), last[k]); err != nil {
				return err
			}
		}
		return nil
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	b.held -= n
	if err != nil {
		return 0, 0, appendError(name, err)
	}
	b.count += stored // the others were stored before, and counted
	if last := first + uint64(stored) - 1; stored > 0 && last > b.last {
		b.last = last
		close(b.notify)
		b.notify = make(chan struct{})
	}
	if n < len(envs) {
		return first, n, fmt.Errorf("inbox: append to %q: %w (%d stored of %d)", name, ErrFull, n, len(envs))
	}
	return first, n, nil
}

// Pull returns up to max messages of inbox name with a cursor greater than
// after, in cursor order, including ones pulled before but not acknowledged,
// and no more than Config.MaxPullBytes of them (at least one).
// When there are none it waits up to wait (bounded by Config.MaxWait) for
// one to arrive; an empty result is not an error.
func (s *Store) Pull(ctx context.Context, name string, after uint64, max int, wait time.Duration) ([]*pb.Envelope, error) {
	if max <= 0 || max > s.cfg.MaxPull {
		max = s.cfg.MaxPull
	}
	wait = min(wait, s.cfg.MaxWait)
	var timer <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	for {
		s.mu.Lock()
		b, ok := s.boxes[name]
		closed := s.closed
		var notify chan struct{}
		var last uint64
		if ok {
			notify, last = b.notify, b.last
		}
		s.mu.Unlock()
		switch {
		case closed:
			return nil, ErrClosed
		case s.Err() != nil:
			return nil, fmt.Errorf("inbox: pull %q: %w", name, s.Err())
		case !ok:
			return nil, fmt.Errorf("inbox: pull %q: %w", name, ErrNoSuchInbox)
		case after > last:
			return nil, fmt.Errorf("inbox: pull %q: %w: after %d, last %d", name, ErrPullBeyond, after, last)
		}
		if last > after {
			// No further than last: a commit whose appenders have not yet
			// counted it may be in the file, and a cursor Pull hands out
			// must never be one a later Pull calls beyond the last.
			msgs, err := s.read(name, after, last, max)
			if err != nil || len(msgs) > 0 {
				return msgs, err
			}
		}
		if timer == nil {
			return nil, nil
		}
		select {
		case <-notify:
		case <-timer:
			return nil, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("inbox: pull %q: %w", name, ctx.Err())
		case <-s.done:
			return nil, ErrClosed
		}
	}
}

// read returns up to max messages of inbox name with cursors in
// (after, last].
func (s *Store) read(name string, after, last uint64, max int) ([]*pb.Envelope, error) {
	var out []*pb.Envelope
	err := s.db.View(func(tx *bolt.Tx) error {
		q := tx.Bucket([]byte(prefixQueue + name))
		if q == nil {
			return ErrNoSuchInbox
		}
		c := q.Cursor()
		bytes := 0
		for k, v := c.Seek(be(after + 1)); k != nil && len(out) < max && binary.BigEndian.Uint64(k) <= last; k, v = c.Next() {
			if bytes += len(v); bytes > s.cfg.MaxPullBytes && len(out) > 0 {
				break
			}
			env := &pb.Envelope{}
			if err := proto.Unmarshal(v, env); err != nil {
				return fmt.Errorf("message %d is corrupt: %w", binary.BigEndian.Uint64(k), err)
			}
			out = append(out, env)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, berrors.ErrDatabaseNotOpen) {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("inbox: pull %q: %w", name, err)
	}
	return out, nil
}

// AckUpTo deletes the messages of inbox name with a cursor up to and
// including upTo and returns how many it deleted. Acking again (or below)
// is a no-op; a cursor beyond the last stored message is refused with
// ErrAckBeyond, so the watermark never passes durable work.
func (s *Store) AckUpTo(name string, upTo uint64) (int, error) {
	s.mu.Lock()
	b, ok := s.boxes[name]
	closed := s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return 0, ErrClosed
	case !ok:
		return 0, fmt.Errorf("inbox: ack %q: %w", name, ErrNoSuchInbox)
	}
	deleted := 0
	err := s.update(func(tx *bolt.Tx) error {
		q := tx.Bucket([]byte(prefixQueue + name))
		if q == nil {
			return ErrNoSuchInbox
		}
		if upTo > q.Sequence() { // the durable high-water, not the in-memory view
			return fmt.Errorf("%w: cursor %d, last stored %d", ErrAckBeyond, upTo, q.Sequence())
		}
		c := q.Cursor()
		for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= upTo; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
			deleted++
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, berrors.ErrDatabaseNotOpen) {
			return 0, ErrClosed
		}
		return 0, fmt.Errorf("inbox: ack %q up to %d: %w", name, upTo, err)
	}
	s.mu.Lock()
	b.count -= deleted
	b.acked = max(b.acked, upTo)
	s.mu.Unlock()
	return deleted, nil
}

// eventSeqField is pb.Envelope's event_seq, the cursor; cursorFieldLen is
// the most its tag and varint take.
const (
	eventSeqField  = 12
	cursorFieldLen = 1 + binary.MaxVarintLen64
)

func be(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

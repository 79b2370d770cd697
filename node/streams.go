package node

import (
	"encoding/hex"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// StreamID names a reliable stream as its receiver sees it: the ordered
// flow of reliable messages from one sender outbox to one actor. A handler
// that stores Message.Stream() and Message.Sequence() with its own effects
// (in the same transaction) can skip a message it has already applied, and
// so gets an exactly-once effect even across a crash of this node.
type StreamID struct {
	Node   string   // the sender node, as verified by its certificate
	Outbox [16]byte // the sender's outbox id: a wiped sender starts new streams
	Epoch  uint64   // changes when the sender's state went back (a restored backup)
	Actor  string   // the recipient actor on this node
}

// String returns "node/outbox-hex/epoch>actor".
func (s StreamID) String() string {
	return fmt.Sprintf("%s/%s/%d>%s", s.Node, hex.EncodeToString(s.Outbox[:]), s.Epoch, s.Actor)
}

// key returns the stream's key in the outbox file.
func (s StreamID) key() []byte { return outbox.StreamKey(s.Node, s.Outbox, s.Epoch, s.Actor) }

// inbound is the receiving side of reliable streams: a cache of the
// watermarks of the streams in use, backed by the outbox file.
type inbound struct {
	store *outbox.Store
	// wg counts the commits under way, from the hand-off to the store to
	// the end of their callback (which may start the next): settle waits
	// for them. The first Add of a chain comes from an actor's goroutine,
	// later ones from a callback that is itself counted, so no Add from
	// zero can race with settle's Wait once the actors have stopped.
	wg sync.WaitGroup

	// ahead holds, per stream key, what its handler applied (WithApplied)
	// above its watermark when it was loaded, until the watermark catches
	// up (reported). nAhead is len(ahead), read without the lock.
	aheadMu sync.Mutex
	ahead   map[string]uint64
	nAhead  atomic.Int32

	// refused holds the messages above their stream's watermark refused
	// for room (divergentAtRoom) or answered without their effect
	// (notRun), to compare with what later runs under their sequences
	// (refusals).
	refused refusals

	// mu guards the fields below.
	mu      sync.Mutex
	streams map[string]*inStream // by string(StreamID.key())
	// unapplied holds the keys of cached streams loaded while their actor
	// was not there (known): its WithApplied is asked at its first lookup.
	unapplied map[string]struct{}
	// failedKeys holds, per stream, the keys of commits that failed, held
	// and kept for the stream's next commit (keepKeys).
	failedKeys map[*inStream][][]byte
	anyFailed  atomic.Bool // len(failedKeys) > 0, read without mu by commit
	// retries holds the streams whose last commit the disk refused, and
	// their next (retryCommit); closed stops them (settle).
	retries  map[*inStream]*commitRetry
	anyRetry atomic.Bool // len(retries) > 0, read without mu by committed
	closed   bool
}

// inStream is one stream's receiving state.
//
// The one owner of the stream's decisions (duplicate? in order? run?) is
// the recipient actor's goroutine, which takes its messages one at a time:
// only it moves w. Other goroutines read durable (post-time duplicates)
// and the commit bookkeeping below.
type inStream struct {
	key string // the stream's key in the outbox file (StreamID.key); also its map key

	// w is the watermark: the highest sequence whose handler succeeded, or
	// that an idempotency key answered. Written by the owner only.
	w atomic.Uint64
	// durable is the highest watermark known to be committed, and
	// durableDigest the digest committed with it (see past; 0 if unknown),
	// both moved under cmu: a receipt that gives the durable watermark
	// while w is ahead of it gives that digest (digestAt).
	durable       atomic.Uint64
	durableDigest atomic.Uint64
	// past holds, while w is 0, the horizon of forgotten streams of the
	// stream's sender outbox and epoch (outbox.Watermark), set at load: a
	// message at or below it may have run before this node forgot the
	// stream, and is refused. From the first move of w on it holds the
	// digest of the message at w (pb.StreamDigest; 0 if unknown), moved with
	// w under cmu, or divergedMark. One field for both keeps the struct
	// small; read them through horizon and digest.
	past atomic.Uint64
	// users counts actors deciding on or running a message of the stream
	// now (acquire/release); a stream in use is never evicted. Guarded by
	// inbound.mu.
	users int32
	// lastUse is the store's elapsed clock, in seconds, at the last lookup
	// or release (eviction). Guarded by inbound.mu. Seconds in 32 bits next
	// to users keep the struct at 80 bytes, a smaller allocation class
	// than 96, for every cached stream.
	lastUse int32

	// arrived is the highest sequence of the stream posted to its actor's
	// mailbox; receipts carry it, with the mailbox's room, so that its
	// sender can tell what of its messages the room already counts.
	arrived atomic.Uint64

	// cmu guards the field below: at most one commit of the stream is with
	// the store, and what waits for durability meanwhile is gathered in
	// pend. pend is nil while nothing waits, so an idle stream stays small.
	cmu  sync.Mutex
	pend *pending
}

// posted records that the message of sequence seq is in the actor's
// mailbox (arrived never goes back: a copy of an earlier one may come
// after it).
func (st *inStream) posted(seq uint64) {
	for {
		cur := st.arrived.Load()
		if seq <= cur || st.arrived.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// horizon is the forgotten horizon (see past): 0 once w moved.
func (st *inStream) horizon() uint64 {
	if st.w.Load() != 0 {
		return 0
	}
	return st.past.Load()
}

// digest is the digest of the message at w (see past), 0 if unknown.
func (st *inStream) digest() uint64 {
	if st.w.Load() == 0 {
		return 0
	}
	return st.past.Load()
}

// divergedMark takes the place of a stream's digest once its sender showed
// another history (divergent). It is committed with the watermark like a
// digest, so the mark outlives the stream's eviction from the cache and a
// restart while messages of the emission that found it out still wait.
const divergedMark = math.MaxUint64

// pending is a stream's commit bookkeeping while one is under way.
type pending struct {
	next     []durableWaiter
	nextKeys [][]byte
}

// durableWaiter is a receipt to send once the watermark covers seq durably.
type durableWaiter struct {
	seq uint64
	fn  func(err error, watermark uint64)
}

func newInbound(store *outbox.Store) *inbound {
	return &inbound{store: store, streams: make(map[string]*inStream)}
}

// get returns the stream id names, loading its watermark from the store on
// first use (and from applied, the recipient actor's WithApplied, if set).
func (in *inbound) get(id StreamID, applied func(StreamID) uint64) (*inStream, error) {
	return in.lookup(id, false, applied)
}

// known is acquire for a stream of an actor that is not there (release
// it): nil when the stream has no watermark, so that messages to actors
// that never were leave nothing behind. A stream it loads is cached (a
// mark of divergence made on it must be seen by the actor, spawned again),
// and the actor's WithApplied is asked at the stream's next lookup with
// one.
func (in *inbound) known(id StreamID) *inStream {
	key := string(id.key())
	now := elapsedSeconds(in.store.ElapsedMs())
	in.mu.Lock()
	defer in.mu.Unlock()
	if st := in.streams[key]; st != nil {
		st.users++
		st.lastUse = now
		return st
	}
	rec, err := in.store.StreamRecord([]byte(key))
	if err != nil || rec.Watermark == 0 {
		return nil
	}
	st := loadedStream(key, rec)
	st.users, st.lastUse = 1, now
	in.streams[key] = st
	if in.unapplied == nil {
		in.unapplied = map[string]struct{}{}
	}
	in.unapplied[key] = struct{}{}
	return st
}

// loadedStream is a stream as its record on disk says it is.
func loadedStream(key string, rec outbox.StreamRecord) *inStream {
	st := &inStream{key: key}
	st.past.Store(max(rec.Forgotten, rec.Digest)) // one of them is 0
	st.w.Store(rec.Watermark)
	st.durable.Store(rec.Watermark)
	st.durableDigest.Store(rec.Digest)
	return st
}

// acquire is get for the stream's owner: the stream stays cached until
// release, however long its handler runs.
func (in *inbound) acquire(id StreamID, applied func(StreamID) uint64) (*inStream, error) {
	return in.lookup(id, true, applied)
}

// lookup is get and acquire: the use is counted under the same lock that
// found the stream, so eviction cannot come in between.
func (in *inbound) lookup(id StreamID, use bool, applied func(StreamID) uint64) (*inStream, error) {
	key := id.key()
	now := in.store.ElapsedMs()
	in.mu.Lock()
	defer in.mu.Unlock()
	st := in.streams[string(key)]
	if st == nil {
		rec, err := in.store.StreamRecord(key)
		if err != nil {
			return nil, err
		}
		st = loadedStream(string(key), rec)
		if applied != nil {
			if a := applied(id); a > rec.Watermark {
				// The handler applied more than the watermark on disk says
				// (a crash came between their commits, or outbox.db was
				// restored from a backup): the receipts say so.
				in.noteAhead(st, a)
			}
		}
		in.streams[st.key] = st
	} else if applied != nil && len(in.unapplied) > 0 {
		if _, ok := in.unapplied[st.key]; ok {
			// Loaded while its actor was not there (known): nothing ran
			// since, so the watermark is still the one on disk.
			delete(in.unapplied, st.key)
			if a := applied(id); a > st.w.Load() {
				in.noteAhead(st, a)
			}
		}
	}
	st.lastUse = elapsedSeconds(now)
	if use {
		st.users++
	}
	return st, nil
}

// divergent reports whether env, a message of st about to be decided by
// its owner, shows that the stream's sender has another history than this
// node: it carries the watermark's sequence with other contents than the
// message that moved the watermark there (a copy differs only in msg id
// and TTL), or the stream was found so before. A sender whose outbox went
// back (restored from a backup) sends new messages under sequences this
// node has seen; those at or below the watermark would otherwise be taken
// for copies and acknowledged without running. The stream is then marked
// (divergedMark, committed with its watermark): the messages after env in
// the same emission must not run either, since the sender, told DIVERGED,
// sends them again in a new epoch, and the old epoch has nothing more to
// run.
func (in *inbound) divergent(st *inStream, env *pb.Envelope) bool {
	d := st.digest()
	if d == divergedMark {
		return true
	}
	w := st.w.Load()
	if env.GetSequence() != w || d == 0 || d == pb.StreamDigest(env) {
		return false
	}
	in.advance(st, w, divergedMark, nil, func(error, uint64) {})
	return true
}

// earlyVerdict is what the goroutine that received a stream message can
// decide before its owner (early).
type earlyVerdict int

const (
	earlyNone     earlyVerdict = iota // the owner decides
	earlyCopy                         // a copy of a message that ran: DUPLICATE, with the watermark's digest
	earlyDiverged                     // the stream is marked divergent: DIVERGED
)

// early decides env, a message of st, on the goroutine that received it
// when it can: a message below the durable watermark is a copy, and so is
// one at it whose digest is that of the message that ran there, or not
// known (as the owner takes it). On a stream marked divergent either is
// answered DIVERGED, as the owner answers every message of it (a copy's
// DUPLICATE would let a sender that could not store its new epoch ack a
// new message under an old sequence). A message at the durable watermark
// with another digest goes to the owner (divergent), and so does every
// message above it.
func (in *inbound) early(st *inStream, env *pb.Envelope) earlyVerdict {
	seq, d := env.GetSequence(), st.durable.Load()
	switch {
	case seq > d:
		return earlyNone
	case st.digest() == divergedMark:
		return earlyDiverged
	case seq < d:
		return earlyCopy
	}
	// At it: a copy when the digest kept for it is the message's, or not
	// known (a watermark an older release moved), as the owner judges it
	// (divergent). A watermark that moved on meanwhile: the owner decides.
	sd := pb.StreamDigest(env)
	if dd, ok := st.watermarkDigest(seq); ok && dd != divergedMark && (dd == 0 || dd == sd) {
		return earlyCopy
	}
	return earlyNone
}

// divergentAtRoom is divergent for a message of st refused for room (its
// mailbox or its sender's share of this node full, or dropped from its
// mailbox for a newer message) before the owner could decide it, called
// from the goroutine that received it or dropped it. The receiver
// answers messages below its durable watermark as copies without looking
// at them and checks only the one at the watermark: were that one refused
// for room, a sender restored from a backup would take the new messages it
// sent under the lower sequences for copies and never send them again. So
// a message at the watermark's sequence with other contents is answered
// DIVERGED here too, and the stream is marked as divergent marks it, under
// cmu, where the owner moves the watermark (and keeps the mark). A message
// above the watermark is refused for room, and its sequence and digest
// are kept (refusals) until the watermark passes it: the message that
// moves the watermark there is compared with it then (wait), since another
// message under that sequence may be queued or running already (the old
// sender's, while its restored self sends the refused one), and the
// messages chained behind the refused one must not run after it.
func (in *inbound) divergentAtRoom(st *inStream, peer string, env *pb.Envelope) bool {
	seq := env.GetSequence()
	if d, w := st.digest(), st.w.Load(); d != divergedMark && (seq < w || seq == w && d == 0) {
		return false // the common refusal of a copy: nothing to compare
	}
	sd := pb.StreamDigest(env)
	st.cmu.Lock()
	w, d := st.w.Load(), st.past.Load()
	if w == 0 || d != divergedMark && (seq != w || d == 0 || d == sd) {
		if seq > w {
			in.refused.note(st.key, peer, seq, sd, in.store.ElapsedMs())
		}
		st.cmu.Unlock()
		return false
	}
	start := false
	if d != divergedMark {
		st.past.Store(divergedMark)
		start = st.queue(w, nil, func(error, uint64) {})
	}
	st.cmu.Unlock()
	if start {
		in.commit(st)
	}
	return true
}

// notRun keeps env, a message of st from peer answered without moving
// the watermark (its handler failed, it was not run, out of order,
// expired, refused for room), as refused (refusals) when it is above the
// watermark: the message that then moves the watermark to its sequence
// is compared with it, so that another one there (the old sender's, its
// restored self's failing first) marks the stream divergent before what
// is chained behind env runs.
func (in *inbound) notRun(st *inStream, peer string, env *pb.Envelope) {
	if seq := env.GetSequence(); seq > st.w.Load() {
		in.refused.note(st.key, peer, seq, pb.StreamDigest(env), in.store.ElapsedMs())
	}
}

// digestAt is the digest of the message that ran at w, st's watermark or
// its durable one, for a receipt that gives w as the watermark
// (watermark_digest): 0 when w is neither (the receipt says what the
// handler applied), the digest is not known, or the stream is marked
// divergent. Read under cmu, where each watermark and its digest move
// together and the mark is set. A copy's receipt uses copyWatermark.
func (in *inbound) digestAt(st *inStream, w uint64) uint64 {
	st.cmu.Lock()
	defer st.cmu.Unlock()
	d, _ := in.digestAtLocked(st, w)
	return d
}

// digestAtLocked is digestAt with cmu held, and says whether the stream
// is marked divergent.
func (in *inbound) digestAtLocked(st *inStream, w uint64) (d uint64, marked bool) {
	if st.w.Load() != 0 && st.past.Load() == divergedMark {
		return 0, true
	}
	switch {
	case w == 0:
	case w == st.w.Load():
		d = st.past.Load()
	case w == st.durable.Load():
		d = st.durableDigest.Load()
	}
	if d == divergedMark {
		d = 0
	}
	return d, false
}

// copyWatermark is the watermark a copy's receipt (DUPLICATE) or a room
// refusal gives, st's durable one as reported says, with its digest
// (digestAt) and whether the stream is marked divergent, read in one step
// under cmu: a copy that found no mark carries the digest, and one that
// found it is answered as a marked stream's message (answerDiverged),
// with no moment in between when the mark can come and take the digest's
// place. Read apart, a commit ending in between
// moved the durable watermark past the one read, whose digest was then
// no longer kept: the receipt went out without one, and a restored
// sender whose emission held only a new message under that sequence took
// it for a copy and acked it. A higher durable watermark than the one a
// copy was judged by is as true for it.
func (in *inbound) copyWatermark(st *inStream) (w, d uint64, marked bool) {
	st.cmu.Lock()
	defer st.cmu.Unlock()
	// What the handler applied, when higher, has a digest only if it is
	// the stream's watermark. (reported takes aheadMu, never held while
	// taking cmu.)
	w = in.reported(st, st.durable.Load())
	d, marked = in.digestAtLocked(st, w)
	return w, d, marked
}

// watermarkDigest returns what st keeps in the digest's place for w, its
// watermark (past) or its durable one (durableDigest), read under cmu
// with the watermark it belongs to; ok=false when w is neither.
func (st *inStream) watermarkDigest(w uint64) (d uint64, ok bool) {
	st.cmu.Lock()
	defer st.cmu.Unlock()
	switch w {
	case st.w.Load():
		return st.past.Load(), true
	case st.durable.Load():
		return st.durableDigest.Load(), true
	}
	return 0, false
}

// answerDiverged answers a message of st, a stream marked divergent, with
// DIVERGED through rc once the mark is durable: at once if it is, else
// when the commit that records it ends. Told DIVERGED, the sender sends
// the old epoch's messages again in a new one; a receiver that crashed
// before its mark reached the disk would load the stream unmarked and run
// a copy of the old epoch still on its way (held at a forwarder) beside
// the new epoch's. A commit the disk refused is answered CAPACITY, as for
// a watermark (onDurable): the sender asks again later.
//
// A copy decided before the mark and answered after it is answered so
// too, not DUPLICATE: the mark took the place of its watermark's digest,
// and a DUPLICATE without one lets a restored sender take a new message
// under that sequence for a copy and ack it, where the DIVERGED of its
// emission, now sent only once the mark is durable, may come too late to
// stop it (or not at all, if the disk refuses the mark).
func (in *inbound) answerDiverged(st *inStream, rc func(*pb.Receipt)) {
	fn := func(err error, _ uint64) {
		// A commit that failed after an earlier one made the mark durable
		// changes nothing: DIVERGED.
		if err != nil && st.durableDigest.Load() != divergedMark {
			rc(&pb.Receipt{Code: pb.Receipt_CAPACITY, RetryAfterMs: notDurableRetry.Milliseconds(), Message: "mark of divergence not durable: " + err.Error()})
			return
		}
		rc(divergedReceipt(st))
	}
	st.cmu.Lock()
	if st.durableDigest.Load() == divergedMark {
		st.cmu.Unlock()
		fn(nil, 0)
		return
	}
	start := st.queue(st.w.Load(), nil, fn) // the next commit reads the mark
	st.cmu.Unlock()
	if start {
		in.commit(st)
	}
}

// divergedReceipt answers a message of a stream found divergent.
func divergedReceipt(st *inStream) *pb.Receipt {
	return &pb.Receipt{Code: pb.Receipt_DIVERGED, Watermark: st.w.Load(),
		Message: "the sender's history of this stream differs from this node's (its outbox went back, e.g. restored from a backup): start a new epoch"}
}

// noteAhead records that the handler of st applied sequences up to a,
// above its watermark. Called with in.mu held.
func (in *inbound) noteAhead(st *inStream, a uint64) {
	in.aheadMu.Lock()
	defer in.aheadMu.Unlock()
	if in.ahead == nil {
		in.ahead = map[string]uint64{}
	}
	in.ahead[st.key] = a
	in.nAhead.Store(int32(len(in.ahead)))
}

// reported is the watermark a receipt of st gives its sender: w, or what
// st's handler applied (WithApplied) while that is higher. The messages up
// to it still run (the handler skips those it applied, and keys and
// replies are recorded as for any other), but a sender whose state went
// back (a restored backup) learns from it that it is sending new messages
// under sequences the handler has taken, and starts a new epoch.
func (in *inbound) reported(st *inStream, w uint64) uint64 {
	if in.nAhead.Load() == 0 {
		return w
	}
	in.aheadMu.Lock()
	defer in.aheadMu.Unlock()
	a, ok := in.ahead[st.key]
	switch {
	case !ok:
		return w
	case w >= a:
		delete(in.ahead, st.key) // the watermark caught up
		in.nAhead.Store(int32(len(in.ahead)))
		return w
	}
	return a
}

// release ends an acquire.
func (in *inbound) release(st *inStream) {
	now := in.store.ElapsedMs()
	in.mu.Lock()
	st.users--
	st.lastUse = elapsedSeconds(now)
	in.mu.Unlock()
}

// evictIdle forgets cached streams unused for idleMs, in use by no actor,
// whose watermark is durable and that wait for nothing, no commit nor a
// retry of one: their state is on disk.
func (in *inbound) evictIdle(idleMs int64) int {
	in.refused.expire(in.store.ElapsedMs() - refusedKeep.Milliseconds())
	// lastUse is rounded down to the second, so a stream is kept while
	// lastUse >= the cutoff's second: never evicted before idleMs has
	// passed, at most a second after.
	cutoff := (in.store.ElapsedMs() - idleMs) / 1000
	in.mu.Lock()
	defer in.mu.Unlock()
	n := 0
	for k, st := range in.streams {
		if st.users > 0 || int64(st.lastUse) >= cutoff || st.durable.Load() != st.w.Load() || in.retries[st] != nil ||
			st.past.Load() != st.durableDigest.Load() && st.w.Load() != 0 {
			continue // in use, recent, or with something not yet on disk (a watermark, or a mark of divergence)
		}
		st.cmu.Lock()
		busy := st.pend != nil
		st.cmu.Unlock()
		if !busy {
			delete(in.streams, k)
			delete(in.unapplied, k)
			n++
		}
	}
	return n
}

// elapsedSeconds is an elapsed-clock reading in ms as whole seconds,
// clamped to 32 bits (68 years of elapsed time).
func elapsedSeconds(ms int64) int32 {
	return int32(min(max(ms/1000, 0), math.MaxInt32))
}

// len returns how many streams are cached.
func (in *inbound) len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.streams)
}

// afterDurable calls fn once the watermark covers seq durably (at once if
// it does already), with the commit's error or nil and the watermark. fn
// runs on the store's committer or the caller's goroutine and must not
// block.
func (in *inbound) afterDurable(st *inStream, seq uint64, fn func(err error, watermark uint64)) {
	if st.durable.Load() >= seq {
		fn(nil, st.durable.Load())
		return
	}
	in.wait(st, seq, 0, nil, false, fn)
}

// advance moves the watermark to seq (the owner only: seq ran, or its key
// was seen), recording digest (pb.StreamDigest) as the message's at it, and
// calls fn as afterDurable does. keys are idempotency keys that took
// effect with seq: they are registered for the next commit in the same
// step that moves the watermark, under cmu, where commit reads both, so
// no commit makes seq's watermark durable without them.
func (in *inbound) advance(st *inStream, seq, digest uint64, keys [][]byte, fn func(err error, watermark uint64)) {
	in.wait(st, seq, digest, keys, true, fn)
}

func (in *inbound) wait(st *inStream, seq, digest uint64, keys [][]byte, move bool, fn func(err error, watermark uint64)) {
	if len(keys) > 0 {
		// Seen from now on, though the commit that records them may start
		// only after the one under way: a repeat right behind must not run.
		in.store.HoldKeys(keys)
	}
	st.cmu.Lock()
	if move {
		if in.refused.passed(st.key, seq, digest) {
			// Marked as divergent marks it: what ran under seq is not
			// what its sender sent there last (see divergentAtRoom).
			digest = divergedMark
		}
		// A mark set meanwhile by divergentAtRoom stays: the owner decided
		// seq before it, and the sender's history differs from here on
		// whatever ran.
		if st.w.Load() == 0 || st.past.Load() != divergedMark {
			st.past.Store(digest)
		}
		st.w.Store(seq)
	}
	start := st.queue(seq, keys, fn)
	st.cmu.Unlock()
	if start {
		in.commit(st)
	}
}

// queue adds a waiter for seq, and keys for the next commit, to what the
// stream's commits gather, and reports whether a commit must start (none
// is under way). Called with cmu held.
func (st *inStream) queue(seq uint64, keys [][]byte, fn func(err error, watermark uint64)) bool {
	start := st.pend == nil
	if start {
		st.pend = &pending{}
	}
	st.pend.next = append(st.pend.next, durableWaiter{seq: seq, fn: fn})
	st.pend.nextKeys = append(st.pend.nextKeys, keys...)
	return start
}

// commit hands the stream's current watermark and gathered keys to the
// store; when it is durable the waiters it covers are answered and, if more
// gathered meanwhile, the next commit starts. The caller has made st.pend
// non-nil; it stays so until the last commit ends with nothing waiting.
func (in *inbound) commit(st *inStream) {
	st.cmu.Lock()
	waiters, keys := st.pend.next, st.pend.nextKeys
	st.pend.next, st.pend.nextKeys = nil, nil
	w := st.w.Load() // under cmu: the keys of every sequence up to w are in keys or committed
	digest := st.digest()
	st.cmu.Unlock()
	keys = append(in.unrecordedKeys(st), keys...)
	in.wg.Add(1)
	in.store.CommitStream(&outbox.StreamCommit{Stream: []byte(st.key), Watermark: w, Digest: digest, Keys: keys}, func(err error) {
		defer in.wg.Done()
		if err == nil {
			st.cmu.Lock()
			if w >= st.durable.Load() { // the same w: a mark of divergence
				st.durable.Store(w)
				st.durableDigest.Store(digest)
			}
			st.cmu.Unlock()
		}
		switch {
		case len(keys) == 0:
		case err == nil:
			in.store.ReleaseKeys(keys) // on disk now
		default:
			in.keepKeys(st, keys)
		}
		var later []durableWaiter
		for _, wt := range waiters {
			if err == nil && wt.seq > w {
				later = append(later, wt) // cannot happen: w was read after it was added
				continue
			}
			wt.fn(err, w)
		}
		st.cmu.Lock()
		st.pend.next = append(st.pend.next, later...)
		more := len(st.pend.next) > 0
		if !more {
			st.pend = nil
		}
		st.cmu.Unlock()
		switch {
		case more:
			// Not on the committer's goroutine: handing an op to the store
			// may wait for room in its queue, which the committer empties.
			in.wg.Go(func() { in.commit(st) })
		case err != nil:
			in.retryCommit(st)
		default:
			in.committed(st)
		}
	})
}

// The waits before a stream commits again after the disk refused.
const (
	minCommitRetry = 100 * time.Millisecond
	maxCommitRetry = 10 * time.Second
)

// commitRetry is a stream's next commit after one the disk refused.
type commitRetry struct {
	timer *time.Timer // nil while none is due
	wait  time.Duration
}

// retryCommit makes st commit again after a wait that doubles from 100 ms
// to 10 s while the disk refuses. The messages the refused commit covered
// ran; if no copy came to start the next commit (its sender gave up),
// their watermark and keys would stay in memory only, the keys held for
// good, and the stream could never be evicted.
func (in *inbound) retryCommit(st *inStream) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return
	}
	r := in.retries[st]
	if r == nil {
		if in.retries == nil {
			in.retries = map[*inStream]*commitRetry{}
		}
		r = &commitRetry{}
		in.retries[st] = r
		in.anyRetry.Store(true)
	}
	if r.timer != nil {
		return
	}
	r.wait = min(max(2*r.wait, minCommitRetry), maxCommitRetry)
	r.timer = time.AfterFunc(r.wait, func() {
		in.mu.Lock()
		if in.closed || in.retries[st] != r {
			in.mu.Unlock()
			return
		}
		r.timer = nil
		in.wg.Add(1) // under mu: settle's Wait starts after closed is set
		in.mu.Unlock()
		defer in.wg.Done()
		// A commit, not afterDurable: what failed may have left the
		// watermark where it was (a diverged mark, kept keys), which
		// afterDurable would take for done.
		in.wait(st, st.w.Load(), 0, nil, false, func(err error, _ uint64) {
			if err == nil {
				// Durable, by this commit or another one that ended
				// while this timer waited: no retry is left to make.
				in.committed(st)
			}
		})
	})
}

// committed forgets st's retry once a commit of it went through.
func (in *inbound) committed(st *inStream) {
	if !in.anyRetry.Load() {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if r := in.retries[st]; r != nil {
		if r.timer != nil {
			r.timer.Stop()
		}
		delete(in.retries, st)
		in.anyRetry.Store(len(in.retries) > 0)
	}
}

// keepKeys keeps the keys of st's commit that failed (the disk refused
// it): their messages ran, and the watermark covering them moved in
// memory, so a copy sent again is answered from memory; a message under
// the same key must be too. They stay held (seen) and go with the
// stream's next commit, which a copy sent again or retryCommit starts.
func (in *inbound) keepKeys(st *inStream, keys [][]byte) {
	in.mu.Lock()
	if in.failedKeys == nil {
		in.failedKeys = map[*inStream][][]byte{}
	}
	in.failedKeys[st] = append(in.failedKeys[st], keys...)
	in.anyFailed.Store(true)
	in.mu.Unlock()
}

// unrecordedKeys takes the keys kept for st's next commit.
func (in *inbound) unrecordedKeys(st *inStream) [][]byte {
	if !in.anyFailed.Load() {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	keys := in.failedKeys[st]
	if keys != nil {
		delete(in.failedKeys, st)
		in.anyFailed.Store(len(in.failedKeys) > 0)
	}
	return keys
}

// settle waits until every commit under way has ended and answered its
// waiters, and cancels the retries of refused commits. Called once no
// actor runs, before the store closes.
func (in *inbound) settle() {
	in.mu.Lock()
	in.closed = true
	for _, r := range in.retries {
		if r.timer != nil {
			r.timer.Stop()
		}
	}
	in.retries = nil
	in.mu.Unlock()
	in.wg.Wait()
}

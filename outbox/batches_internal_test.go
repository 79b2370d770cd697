package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"encoding/binary"
	"google.golang.org/protobuf/proto"

	bolt "go.etcd.io/bbolt"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/mailbox/pb"
)

var batchEpoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func batchConfig(path string, clk Clock, mut func(*Config)) Config {
	cfg := DefaultConfig(path)
	cfg.LockTimeout = 200 * time.Millisecond
	cfg.Clock = clk
	if mut != nil {
		mut(&cfg)
	}
	return cfg
}

// fileQueues reads every queue's order from the file.
func fileQueues(tb testing.TB, s *Store) map[string][]uint64 {
	tb.Helper()
	out := map[string][]uint64{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).ForEach(func(k, v []byte) error {
			r := string(recRecipient(v))
			out[r] = append(out[r], seqOf(k))
			return nil
		})
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// memQueues reads every queue's order from memory and checks the small
// per-queue state against it.
func memQueues(tb testing.TB, s *Store) map[string][]uint64 {
	tb.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := map[string][]uint64{}
	depth := 0
	for r, st := range s.queues {
		var l []uint64
		st.seqs.each(func(sq uint64) bool { l = append(l, sq); return true })
		out[r] = l
		if st.count() != len(l) {
			tb.Errorf("queue %s: count %d, order holds %d %v", r, st.count(), len(l), l)
		}
		if len(l) == 0 {
			tb.Errorf("queue %s: empty queue kept in memory", r)
		} else if st.headSeq != l[0] {
			tb.Errorf("queue %s: headSeq %d, order starts at %d", r, st.headSeq, l[0])
		}
		depth += st.count()
	}
	if depth != s.depth {
		tb.Errorf("depth %d, queues sum to %d", s.depth, depth)
	}
	return out
}

func checkAgree(tb testing.TB, s *Store, when string) {
	tb.Helper()
	f, m := fileQueues(tb, s), memQueues(tb, s)
	for r, fs := range f {
		if !slices.Equal(fs, m[r]) {
			tb.Fatalf("%s: queue %s: file %v, memory %v", when, r, fs, m[r])
		}
	}
	for r, ms := range m {
		if _, ok := f[r]; !ok {
			tb.Fatalf("%s: queue %s in memory %v, not in the file", when, r, ms)
		}
	}
	// Head returns exactly the file's queue (less what it gave up for age).
	for r := range f {
		msgs, _, err := s.Head(HeadRequest{Recipient: r, Max: 1 << 20})
		if err != nil {
			tb.Fatal(err)
		}
		fs := fileQueues(tb, s)[r]
		var got []uint64
		for _, sm := range msgs {
			got = append(got, sm.GetEnvelope().GetSequence())
		}
		if !slices.Equal(got, fs) {
			tb.Fatalf("%s: Head %s = %v, file holds %v", when, r, got, fs)
		}
	}
}

// TestRandomBatchesKeepMemoryAndFileAgreed commits random mixes of every queue operation in
// shared transactions and checks after each that memory and file agree.
func TestRandomBatchesKeepMemoryAndFileAgreed(t *testing.T) {
	for seed := batchSeed0; seed < batchSeed0+30; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel() // each seed its own store; they mostly wait on fsync
			randomBatches(t, seed)
		})
	}
}

func randomBatches(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed*7))
	path := filepath.Join(t.TempDir(), "outbox.db")
	clk := NewManualClock(batchEpoch)
	mut := func(c *Config) {
		c.MaxBatch = 1 + rng.IntN(6)
		c.CommitLinger = time.Millisecond
	}
	s, err := Open(batchConfig(path, clk, mut))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	rcpts := []string{"a@n1", "b@n1", "c@n2"}
	var pool []uint64 // reserved, not yet used
	var used []uint64
	ctx := context.Background()
	for round := range 40 {
		for len(pool) < 40 {
			sq, err := s.ReserveSequence()
			if err != nil {
				t.Fatal(err)
			}
			pool = append(pool, sq)
		}
		release := Stall(t, s)
		var wg sync.WaitGroup
		nops := 0
		failing := rng.IntN(8) == 0
		var restore func()
		for range 1 + rng.IntN(12) {
			r := rcpts[rng.IntN(len(rcpts))]
			pick := func() uint64 {
				if len(used) == 0 {
					return 1
				}
				return used[rng.IntN(len(used))]
			}
			switch op := rng.IntN(10); op {
			case 0, 1, 2, 3: // enqueue
				i := rng.IntN(len(pool))
				if rng.IntN(3) == 0 {
					i = len(pool) - 1 // the highest first
				}
				sq := pool[i]
				if rng.IntN(10) == 0 && len(used) > 0 {
					sq = pick() // a taken sequence, maybe another queue's
				} else {
					pool = slices.Delete(pool, i, i+1)
					used = append(used, sq)
				}
				sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: r, Sender: "app@n0", Type: fmt.Sprint(sq), Sequence: sq}}
				if rng.IntN(2) == 0 {
					sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, fmt.Sprint("k", rng.IntN(2))
				}
				if rng.IntN(4) == 0 {
					sm.Envelope.TtlMs = 1 + rng.Int64N(3000)
				}
				if rng.IntN(2) == 0 {
					wg.Add(1)
					if err := s.EnqueueAsync(ctx, sm, func(Result, error) { wg.Done() }); err != nil {
						wg.Done()
						continue
					}
				} else {
					wg.Go(func() { _, _ = s.Enqueue(ctx, sm) })
				}
			case 4: // ack
				seqs := []uint64{pick(), pick()}
				slices.Sort(seqs)
				wg.Go(func() { _ = s.Ack(r, seqs) })
			case 5: // fail
				sq := pick()
				f := Failure{Reason: "x", Counts: rng.IntN(2) == 0, Permanent: rng.IntN(3) == 0}
				wg.Go(func() { _, _, _ = s.Fail(r, sq, f) })
			case 6: // expire
				seqs := []uint64{pick()}
				wg.Go(func() { _, _ = s.Expire(r, seqs, ReasonExpired) })
			case 7: // drop
				wg.Go(func() { _, _ = s.DropQueue(r, "test") })
			case 8: // replay
				wg.Go(func() { _, _ = s.Replay(DLQFilter{Recipient: r}) })
			case 9:
				s.Defer(r, clk.Monotonic().Milliseconds()+1000)
				continue
			}
			nops++
		}
		for range rng.IntN(3) {
			r := rcpts[rng.IntN(len(rcpts))]
			hw := uint64(0)
			if len(used) > 0 {
				hw = used[rng.IntN(len(used))]
			}
			req := HeadRequest{Recipient: r, Max: 1 + rng.IntN(4), EmittedHW: hw, MaxBytes: rng.IntN(200)}
			wg.Go(func() { _, _, _ = s.Head(req) })
		}
		if rng.IntN(3) == 0 {
			clk.Advance(time.Duration(rng.IntN(2000)) * time.Millisecond)
		}
		if failing {
			restore, _ = faults.FailCommits(path, errors.New("disk full"))
		}
		release()
		wg.Wait()
		if restore != nil {
			restore()
		}
		checkAgree(t, s, fmt.Sprintf("round %d", round))
		if t.Failed() {
			return
		}
		if rng.IntN(5) == 0 {
			before := fileQueues(t, s)
			closeFn := s.Close
			if rng.IntN(2) == 0 {
				closeFn = s.Abandon
			}
			if err := closeFn(); err != nil {
				t.Fatal(err)
			}
			if s, err = Open(batchConfig(path, clk, mut)); err != nil {
				t.Fatal(err)
			}
			checkAgree(t, s, fmt.Sprintf("round %d reopened", round))
			if after := fileQueues(t, s); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("reopen changed queues: %v -> %v", before, after)
			}
		}
	}
}

// crashClock panics at its at-th Now: upgradeQueues reads it once at the
// start of each transaction, so a panic there is a crash between two.
type crashClock struct {
	*ManualClock
	mu sync.Mutex
	n  int
	at int
}

type crashed struct{}

func (c *crashClock) Now() time.Time {
	c.mu.Lock()
	c.n++
	n := c.n
	c.mu.Unlock()
	if n == c.at {
		panic(crashed{})
	}
	return c.ManualClock.Now()
}

// upgradeCrashing runs the format 2 upgrade of path with maxBatch and
// crashes it before its at-th transaction; it reports whether it crashed.
func upgradeCrashing(t *testing.T, path string, maxBatch, at int) (didCrash bool) {
	cfg := format2Config(path, maxBatch)
	cfg.Clock = &crashClock{ManualClock: NewManualClock(format2Epoch.Add(time.Minute)), at: at}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := &Store{cfg: cfg, db: db}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crashed); !ok {
				panic(r)
			}
			didCrash = true
		}
	}()
	if err := s.upgradeQueues(); err != nil {
		t.Fatal(err)
	}
	return false
}

// TestFormat2UpgradeCrashingBetweenAnyTwoTransactions crashes the upgrade of
// testdata/format2 between every two of its transactions and opens the
// file again: every message must be where it was.
func TestFormat2UpgradeCrashingBetweenAnyTwoTransactions(t *testing.T) {
	for _, maxBatch := range []int{1, 2, 3, 5} {
		for at := 1; ; at++ {
			path := copyFormat2(t)
			if !upgradeCrashing(t, path, maxBatch, at) {
				break
			}
			t.Run(fmt.Sprintf("max_batch=%d/crash=%d", maxBatch, at), func(t *testing.T) {
				s, err := Open(format2Config(path, maxBatch))
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				checkFormat2(t, s)
				checkAgree(t, s, "after the upgrade")
			})
		}
	}
}

// TestCoalescingKeepsTheOrderSmall replaces one key's waiting version thousands
// of times behind a message that stays: the queue's order must stay small.
func TestCoalescingKeepsTheOrderSmall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	s, err := Open(batchConfig(path, NewManualClock(batchEpoch), nil))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	put := func(key string) {
		sq, err := s.ReserveSequence()
		if err != nil {
			t.Fatal(err)
		}
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Sequence: sq}}
		if key != "" {
			sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, key
		}
		// Pipelined: one goroutine's enqueues commit in call order, many
		// to a commit.
		wg.Add(1)
		if err := s.EnqueueAsync(ctx, sm, func(_ Result, err error) {
			defer wg.Done()
			if err != nil {
				t.Error(err)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	put("")
	for i := range 5000 {
		put("k")
		put(fmt.Sprint("j", i%3))
	}
	wg.Wait()
	s.mu.RLock()
	st := s.queues["a@n1"]
	n, c, live := st.seqs.n, st.seqs.capacity(), st.count()
	s.mu.RUnlock()
	t.Logf("live %d entries %d cap %d", live, n, c)
	if n > 4*live+64 || c > 8*live+256 {
		t.Fatalf("queue of %d messages holds %d entries (cap %d)", live, n, c)
	}
}

// writeFormat2 writes a file of format 2 by hand: q/<recipient> buckets of
// 17-byte-header records. queues maps a recipient to its sequences.
func writeFormat2(tb testing.TB, path string, queues map[string][]uint64, body int, high uint64) {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		for _, n := range []string{"q", "out", "exp", "coalesce", "dlq", "in", "indigest", "keys", "keyage", "forgot", "meta"} {
			if _, err := tx.CreateBucket([]byte(n)); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyFormat, u64(2)); err != nil {
			return err
		}
		if err := meta.Put(keySeqHigh, u64(high)); err != nil {
			return err
		}
		for r, seqs := range queues {
			qb, err := tx.Bucket(bucketQueues).CreateBucket([]byte(r))
			if err != nil {
				return err
			}
			for _, sq := range seqs {
				sm := &pb.StoredMessage{CreatedElapsedMs: 1000, Envelope: &pb.Envelope{Recipient: r, Sender: "app@n0", Sequence: sq, Type: fmt.Sprint(sq), MsgId: string(make([]byte, body))}}
				b, err := proto.Marshal(sm)
				if err != nil {
					return err
				}
				var head [17]byte
				binary.BigEndian.PutUint64(head[:8], 1000)
				if err := qb.Put(u64(sq), append(head[:], b...)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// TestFormat2UpgradeOfManyQueues upgrades big interleaved queues (and empty
// ones) with a small MaxBatch.
func TestFormat2UpgradeOfManyQueues(t *testing.T) {
	queues := map[string][]uint64{"e0@n": nil, "e1@n": nil}
	want := 0
	for i := uint64(1); i <= 6000; i++ {
		r := fmt.Sprintf("r%d@n%d", i%5, i%2)
		if i%7 == 0 {
			r = fmt.Sprintf("x%d@n", i%97)
		}
		queues[r] = append(queues[r], i)
		want++
	}
	for _, mb := range []int{7, 1000} {
		t.Run(fmt.Sprint(mb), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "outbox.db")
			writeFormat2(t, path, queues, 200, 6000)
			s, err := Open(batchConfig(path, NewManualClock(batchEpoch), func(c *Config) { c.MaxBatch = mb }))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			got := fileQueues(t, s)
			for r, seqs := range queues {
				if !slices.Equal(got[r], seqs) {
					t.Fatalf("%s: %d records after the upgrade, want %d", r, len(got[r]), len(seqs))
				}
			}
			checkAgree(t, s, "after the upgrade")
			if st := s.Stats(); st.Depth != want || st.DLQDepth != 0 {
				t.Fatalf("depth %d dlq %d, want %d 0", st.Depth, st.DLQDepth, want)
			}
			if n, _ := BucketStats(s, "q"); n.BucketN != 0 {
				t.Fatalf("q left: %+v", n)
			}
		})
	}
}

var batchSeed0 = uint64(1)

// TestHeadDuringAReplacementKeepsTheWaitingVersion: a queue always holds
// one version of key k below a message P that stays. While versions
// replace each other (each below P), Head(Max 2) must return a version and
// then P: before the replacement's commit the old version is the head,
// after it the new one. Head reads records from a snapshot that bbolt
// shows readers before the commit returns, and each queue's order from
// memory, which the committer changes after: without the bound on what
// the two agree on, both versions were skipped and P came out first.
func TestHeadDuringAReplacementKeepsTheWaitingVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	s, err := Open(batchConfig(path, NewManualClock(batchEpoch), nil))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const n = 3000
	var versions []uint64
	for range n {
		sq, err := s.ReserveSequence()
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, sq)
	}
	put := func(sq uint64, key string) {
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Sequence: sq}}
		if key != "" {
			sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, key
		}
		if _, err := s.Enqueue(ctx, sm); err != nil {
			t.Error(err)
		}
	}
	put(versions[0], "k")
	p, err := s.ReserveSequence()
	if err != nil {
		t.Fatal(err)
	}
	put(p, "")
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		for _, sq := range versions[1:] {
			put(sq, "k")
		}
	})
	bad, heads, short := 0, 0, 0
	var example []uint64
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		msgs, _, err := s.Head(HeadRequest{Recipient: "a@n1", Max: 2})
		if err != nil {
			t.Fatal(err)
		}
		heads++
		// A version, then P; or, cut short by a commit that kept replacing
		// the version while Head read, a prefix of that: never P without
		// the version waiting before it.
		var got []uint64
		for _, m := range msgs {
			got = append(got, m.GetEnvelope().GetSequence())
		}
		switch {
		case len(got) == 2 && got[0] < p && got[1] == p:
		case len(got) < 2 && (len(got) == 0 || got[0] < p):
			short++
		default:
			bad++
			example = got
		}
	}
	wg.Wait()
	if bad > 0 {
		t.Fatalf("%d of %d Heads did not return the waiting version before P=%d (e.g. %v)", bad, heads, p, example)
	}
	t.Logf("%d Heads, %d cut short", heads, short)
}

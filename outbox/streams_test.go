package outbox_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meshnode/meshnode/outbox"
)

type streamTuple struct {
	node  string
	id    [16]byte
	epoch uint64
	actor string
}

// Names may contain anything a separator-based encoding would trip on:
// '>', '@', NUL, bytes that look like length prefixes.
func TestStreamKeyUnambiguous(t *testing.T) {
	id := [16]byte{1, 2, 3}
	tuples := []streamTuple{
		{"a>b", id, 1, "c"},
		{"a", id, 1, "b>c"},
		{"a\x00", id, 1, "c"},
		{"a", id, 1, "\x00c"},
		{"n", id, 1, "xy"},
		{"nx", id, 1, "y"},
		{"", id, 1, "nxy"},
		{"nxy", id, 1, ""},
		{"n\x01", id, 1, "a"},
		{"n", id, 1, "\x01a"},
		{"n", id, 2, "a"},
		{"n", [16]byte{1, 2, 4}, 1, "a"},
		{"a@b", id, 1, "c"},
		{strings.Repeat("x", 200), id, 1, "a"}, // a two-byte length prefix
		{strings.Repeat("x", 199), id, 1, "xa"},
	}
	seen := map[string]int{}
	for i, tp := range tuples {
		k := string(outbox.StreamKey(tp.node, tp.id, tp.epoch, tp.actor))
		if j, dup := seen[k]; dup {
			t.Fatalf("tuples %d %+v and %d %+v share key %q", j, tuples[j], i, tp, k)
		}
		seen[k] = i
	}
	rapid.Check(t, func(rt *rapid.T) {
		gen := func(l string) streamTuple {
			var id [16]byte
			id[0] = rapid.Byte().Draw(rt, l+"id")
			return streamTuple{
				node:  rapid.StringOfN(rapid.SampledFrom([]rune{'a', '>', 0, 1, '@'}), 0, 4, -1).Draw(rt, l+"node"),
				id:    id,
				epoch: rapid.Uint64Range(0, 2).Draw(rt, l+"epoch"),
				actor: rapid.StringOfN(rapid.SampledFrom([]rune{'a', '>', 0, 1, '@'}), 0, 4, -1).Draw(rt, l+"actor"),
			}
		}
		a, b := gen("a"), gen("b")
		ka := outbox.StreamKey(a.node, a.id, a.epoch, a.actor)
		kb := outbox.StreamKey(b.node, b.id, b.epoch, b.actor)
		if bytes.Equal(ka, kb) != (a == b) {
			rt.Fatalf("%+v and %+v: keys equal %v", a, b, bytes.Equal(ka, kb))
		}
	})
}

func TestScopedKeyUnambiguous(t *testing.T) {
	type scoped struct{ node, actor, key string }
	tuples := []scoped{
		{"a>b", "c", "k"},
		{"a", "b>c", "k"},
		{"a", "b", "c>k"},
		{"a\x00", "b", "k"},
		{"a", "\x00b", "k"},
		{"a", "b\x00", "k"},
		{"a", "b", "\x00k"},
		{"a", "bk", ""},
		{"a", "b", "k"},
		{"ab", "", "k"},
		{"", "ab", "k"},
	}
	seen := map[string]int{}
	for i, tp := range tuples {
		k := string(outbox.ScopedKey(tp.node, tp.actor, tp.key))
		if j, dup := seen[k]; dup {
			t.Fatalf("%+v and %+v share key %q", tuples[j], tp, k)
		}
		seen[k] = i
	}
	rapid.Check(t, func(rt *rapid.T) {
		str := rapid.StringOfN(rapid.SampledFrom([]rune{'a', '>', 0, 2}), 0, 4, -1)
		a := scoped{str.Draw(rt, "an"), str.Draw(rt, "aa"), str.Draw(rt, "ak")}
		b := scoped{str.Draw(rt, "bn"), str.Draw(rt, "ba"), str.Draw(rt, "bk")}
		equal := bytes.Equal(outbox.ScopedKey(a.node, a.actor, a.key), outbox.ScopedKey(b.node, b.actor, b.key))
		if equal != (a == b) {
			rt.Fatalf("%+v and %+v: keys equal %v", a, b, equal)
		}
	})
}

// commitStream runs CommitStream and waits for its done.
func commitStream(tb testing.TB, s *outbox.Store, c *outbox.StreamCommit) error {
	tb.Helper()
	done := make(chan error, 1)
	s.CommitStream(c, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		tb.Fatal("CommitStream's done never called")
		return nil
	}
}

// A key handed to CommitStream counts as seen at once, before its commit,
// so a copy arriving meanwhile is a duplicate; the watermark becomes
// readable, and durable, with the commit.
func TestCommitStreamPendingThenDurable(t *testing.T) {
	e := open(t, nil)
	sk := outbox.StreamKey("n2", [16]byte{9}, 1, "actor")
	key := outbox.ScopedKey("n2", "actor", "order-17")
	release := stall(t, e.Store)
	done := make(chan error, 1)
	e.CommitStream(&outbox.StreamCommit{Stream: sk, Watermark: 5, Keys: [][]byte{key}}, func(err error) { done <- err })
	if seen, err := e.KeySeen(key); !seen || err != nil {
		t.Fatalf("pending key: seen %v %v, want true", seen, err)
	}
	if w, _, _ := e.Watermark(sk); w != 0 {
		t.Fatalf("watermark %d before its commit", w)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w, _, err := e.Watermark(sk); w != 5 || err != nil {
		t.Fatalf("watermark after commit %d %v", w, err)
	}
	// A watermark never goes back.
	if err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: sk, Watermark: 3}); err != nil {
		t.Fatal(err)
	}
	e.reopen(t, nil)
	if w, _, _ := e.Watermark(sk); w != 5 {
		t.Fatalf("watermark after restart %d, want 5", w)
	}
	if seen, err := e.KeySeen(key); !seen || err != nil {
		t.Fatalf("key after restart: %v %v", seen, err)
	}
	if seen, _ := e.KeySeen(outbox.ScopedKey("n2", "other", "order-17")); seen {
		t.Fatal("a key is seen in another actor's scope")
	}
	// An oversized key refuses the whole commit and stays unseen.
	big := outbox.ScopedKey("n2", "actor", strings.Repeat("k", 2*outbox.MaxKeyLen))
	err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: sk, Watermark: 9, Keys: [][]byte{key, big}})
	if !errors.Is(err, outbox.ErrBadMessage) {
		t.Fatalf("oversized key: %v", err)
	}
	if seen, _ := e.KeySeen(big); seen {
		t.Fatal("refused key counts as seen")
	}
	if w, _, _ := e.Watermark(sk); w != 5 {
		t.Fatalf("refused commit moved the watermark to %d", w)
	}
}

// A stream's record keeps the digest of the message at its watermark: it
// moves with the watermark, stays when a lower watermark is committed
// (the watermark stays too), goes when a commit does not know it, and
// survives a restart.
func TestStreamDigestMovesWithItsWatermark(t *testing.T) {
	e := open(t, nil)
	sk := outbox.StreamKey("n2", [16]byte{9}, 1, "actor")
	steps := []struct {
		w, digest uint64
		want      outbox.StreamRecord
	}{
		{5, 0xab, outbox.StreamRecord{Watermark: 5, Digest: 0xab}},
		{3, 0xcd, outbox.StreamRecord{Watermark: 5, Digest: 0xab}},
		{6, 0, outbox.StreamRecord{Watermark: 6}},
		{7, 0xef, outbox.StreamRecord{Watermark: 7, Digest: 0xef}},
	}
	for _, st := range steps {
		if err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: sk, Watermark: st.w, Digest: st.digest}); err != nil {
			t.Fatal(err)
		}
		if r, err := e.StreamRecord(sk); err != nil || r != st.want {
			t.Fatalf("after committing %d with digest %#x: %+v (%v), want %+v", st.w, st.digest, r, err, st.want)
		}
	}
	e.reopen(t, nil)
	if r, err := e.StreamRecord(sk); err != nil || r != steps[len(steps)-1].want {
		t.Fatalf("after a restart: %+v (%v), want %+v", r, err, steps[len(steps)-1].want)
	}
}

func keysOnDisk(tb testing.TB, s *outbox.Store) (keys, ages int) {
	tb.Helper()
	k, err := outbox.BucketStats(s, "keys")
	if err != nil {
		tb.Fatal(err)
	}
	a, err := outbox.BucketStats(s, "keyage")
	if err != nil {
		tb.Fatal(err)
	}
	return k.KeyN, a.KeyN
}

// Keys older than KeyWindow are no longer seen and are pruned from disk by
// the commits that follow, a bounded number per commit.
func TestKeyWindowPrunedInBoundedSteps(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.KeyWindow = time.Minute })
	const n = 3000
	for c := range n / 100 {
		var keys [][]byte
		for i := range 100 {
			keys = append(keys, outbox.ScopedKey("n2", "actor", fmt.Sprint("k", c*100+i)))
		}
		if err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: []byte("s"), Watermark: uint64(c + 1), Keys: keys}); err != nil {
			t.Fatal(err)
		}
	}
	refreshed := outbox.ScopedKey("n2", "actor", "k0")
	e.clk.Advance(50 * time.Second)
	if err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: []byte("s"), Watermark: 99, Keys: [][]byte{refreshed}}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(11 * time.Second) // the first 3000 are 61 s old, k0 11 s
	if seen, _ := e.KeySeen(outbox.ScopedKey("n2", "actor", "k1")); seen {
		t.Fatal("key older than the window still seen")
	}
	if seen, _ := e.KeySeen(refreshed); !seen {
		t.Fatal("key recorded again within the window not seen")
	}
	if k, a := keysOnDisk(t, e.Store); k != n || a != n {
		t.Fatalf("before pruning: %d keys, %d age entries", k, a)
	}
	sync_(t, e.Store) // one commit
	k, a := keysOnDisk(t, e.Store)
	if pruned := n - k; pruned == 0 || pruned > 1024 || a != k {
		t.Fatalf("one commit pruned %d keys (left %d keys, %d age entries), want a bounded step of at most 1024", pruned, k, a)
	}
	t.Logf("one commit pruned %d of %d expired keys", n-k, n-1)
	for range 3 {
		sync_(t, e.Store)
	}
	if k, a := keysOnDisk(t, e.Store); k != 1 || a != 1 {
		t.Fatalf("after pruning: %d keys, %d age entries, want only the refreshed one", k, a)
	}
	if seen, _ := e.KeySeen(refreshed); !seen {
		t.Fatal("refreshed key pruned with its old age entry")
	}
}

// A stream idle longer than StreamRetention is forgotten (watermark 0);
// one that changed within it is kept. Housekeeping looks at a bounded
// number of stream records per commit. A forgotten stream leaves its
// watermark in the horizon of its sender outbox and epoch: the highest
// one forgotten, per (node, outbox, epoch), never another's.
func TestStreamRetentionForgetsIdleStreams(t *testing.T) {
	var mu sync.Mutex
	forgot := map[string]bool{} // what OnForget was told
	e := open(t, func(c *outbox.Config) {
		c.StreamRetention = 10 * time.Hour
		c.RetentionMargin = time.Hour
		c.OnForget = func(streams []outbox.ForgottenStream) {
			mu.Lock()
			defer mu.Unlock()
			for _, f := range streams {
				forgot[string(f.Stream)] = f.Watermark >= 4 && f.Watermark <= 11 // what each was committed with
			}
		}
	})
	const n = 600
	for i := range n {
		sk := outbox.StreamKey("n2", [16]byte{}, 1, fmt.Sprint("old", i))
		e.CommitStream(&outbox.StreamCommit{Stream: sk, Watermark: 7 + uint64(i%3), Digest: 1 + uint64(i)}, func(error) {})
	}
	others := map[string]uint64{"epoch 2": 4, "node n3": 11}
	e.CommitStream(&outbox.StreamCommit{Stream: outbox.StreamKey("n2", [16]byte{}, 2, "old"), Watermark: others["epoch 2"]}, func(error) {})
	e.CommitStream(&outbox.StreamCommit{Stream: outbox.StreamKey("n3", [16]byte{}, 1, "old"), Watermark: others["node n3"]}, func(error) {})
	sync_(t, e.Store) // committed before the clock moves
	e.clk.Advance(5 * time.Hour)
	young := outbox.StreamKey("n2", [16]byte{}, 1, "young")
	if err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: young, Watermark: 3, Digest: 42}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(5*time.Hour + time.Millisecond)
	count := func() int {
		st, err := outbox.BucketStats(e.Store, "in")
		if err != nil {
			t.Fatal(err)
		}
		return st.KeyN
	}
	if c := count(); c != n+3 {
		t.Fatalf("%d stream records, want %d", c, n+3)
	}
	sync_(t, e.Store)
	if c := count(); c < n+3-256 || c == n+3 {
		t.Fatalf("one commit left %d of %d records: want a bounded step of at most 256", c, n+3)
	}
	for range 4 {
		sync_(t, e.Store)
	}
	if c := count(); c != 1 {
		t.Fatalf("%d stream records left, want only the young one", c)
	}
	if got := e.Stats().StreamsForgotten; got != n+2 {
		t.Errorf("Stats counts %d streams forgotten, want %d", got, n+2)
	}
	mu.Lock()
	if len(forgot) != n+2 || !forgot[string(outbox.StreamKey("n2", [16]byte{}, 1, "old0"))] || forgot[string(young)] {
		t.Errorf("told of %d forgotten streams with their watermarks (young among them: %v), want the %d old ones", len(forgot), forgot[string(young)], n+2)
	}
	for k, ok := range forgot {
		if !ok {
			t.Errorf("stream %q told with a watermark it never had", k)
		}
	}
	mu.Unlock()
	if st, err := outbox.BucketStats(e.Store, "indigest"); err != nil || st.KeyN != 1 {
		t.Fatalf("%d digests left (%v), want only the young stream's", st.KeyN, err)
	}
	if r, err := e.StreamRecord(young); err != nil || r.Digest != 42 {
		t.Fatalf("young stream's record %+v (%v), want digest 42", r, err)
	}
	for _, c := range []struct {
		what      string
		key       []byte
		w, forgot uint64
	}{
		{"a forgotten stream", outbox.StreamKey("n2", [16]byte{}, 1, "old0"), 0, 9},
		{"a new stream of the same sender", outbox.StreamKey("n2", [16]byte{}, 1, "new"), 0, 9},
		{"a stream of another epoch", outbox.StreamKey("n2", [16]byte{}, 2, "new"), 0, others["epoch 2"]},
		{"a stream of another node", outbox.StreamKey("n3", [16]byte{}, 1, "new"), 0, others["node n3"]},
		{"a stream of another outbox", outbox.StreamKey("n2", [16]byte{1}, 1, "new"), 0, 0},
		{"the young stream", young, 3, 0},
	} {
		w, forgot, err := e.Watermark(c.key)
		if err != nil || w != c.w || forgot != c.forgot {
			t.Errorf("%s: watermark %d, forgotten horizon %d (%v); want %d, %d", c.what, w, forgot, err, c.w, c.forgot)
		}
	}
	// The horizon never goes back: a later, lower forgotten watermark
	// leaves it.
	e.CommitStream(&outbox.StreamCommit{Stream: outbox.StreamKey("n2", [16]byte{}, 1, "low"), Watermark: 2}, func(error) {})
	sync_(t, e.Store)
	e.clk.Advance(11 * time.Hour)
	for range 3 {
		sync_(t, e.Store)
	}
	if _, forgot, _ := e.Watermark(outbox.StreamKey("n2", [16]byte{}, 1, "new")); forgot != 9 {
		t.Errorf("horizon after forgetting a lower watermark: %d, want 9", forgot)
	}
}

// TestDiskFootprint measures what the receiver's state costs on disk: one
// stream record (watermark) and one idempotency key (key window entry plus
// its age index entry), with realistic names.
func TestDiskFootprint(t *testing.T) {
	e := open(t, nil)
	const n = 5000
	for c := range n / 500 {
		var last error
		for i := range 500 {
			j := c*500 + i
			c := &outbox.StreamCommit{
				Stream:    outbox.StreamKey(fmt.Sprintf("node-%02d", j%50), [16]byte{byte(j), byte(j >> 8)}, 0x1234567890abcdef, fmt.Sprintf("actor-%06d", j)),
				Watermark: uint64(j) + 1_000_000,
				Keys:      [][]byte{outbox.ScopedKey(fmt.Sprintf("node-%02d", j%50), fmt.Sprintf("actor-%06d", j), fmt.Sprintf("order-%08d-%032x", j, j))},
			}
			if i < 499 {
				e.CommitStream(c, func(err error) {
					if err != nil {
						t.Error(err)
					}
				})
			} else {
				last = commitStream(t, e.Store, c)
			}
		}
		if last != nil {
			t.Fatal(last)
		}
	}
	per := func(bucket string) (float64, float64) {
		st, err := outbox.BucketStats(e.Store, bucket)
		if err != nil || st.KeyN != n {
			t.Fatalf("%s: %d records (%v), want %d", bucket, st.KeyN, err, n)
		}
		return float64(st.LeafInuse) / n, float64(st.LeafAlloc+st.BranchAlloc) / n
	}
	inUse, inAlloc := per("in")
	kUse, kAlloc := per("keys")
	aUse, aAlloc := per("keyage")
	streamKey := len(outbox.StreamKey("node-00", [16]byte{}, 0, "actor-000000"))
	scoped := len(outbox.ScopedKey("node-00", "actor-000000", fmt.Sprintf("order-%08d-%032x", 0, 0)))
	t.Logf("stream record: key %d + value 16 bytes; %.0f bytes/stream in leaves, %.0f with page slack", streamKey, inUse, inAlloc)
	t.Logf("idempotency key (%d bytes): %.0f bytes in leaves (keys %.0f + keyage %.0f), %.0f with page slack",
		scoped, kUse+aUse, kUse, aUse, kAlloc+aAlloc)
	if inAlloc > 200 {
		t.Errorf("%.0f bytes per stream record", inAlloc)
	}
	if kAlloc+aAlloc > 400 {
		t.Errorf("%.0f bytes per key", kAlloc+aAlloc)
	}
}

// After Close, CommitStream stores nothing and its keys must not count as
// seen: a receiver asking KeySeen during shutdown would otherwise answer
// DUPLICATE for a message that never ran, and its sender would drop it.
func TestCommitStreamAfterCloseForgetsKeys(t *testing.T) {
	e := open(t, nil)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	key := outbox.ScopedKey("n2", "actor", "k")
	if err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: []byte("s"), Watermark: 1, Keys: [][]byte{key}}); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("CommitStream after Close: %v", err)
	}
	if seen, err := e.KeySeen(key); seen || !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("KeySeen after Close = %v, %v; want false, ErrClosed", seen, err)
	}
}

// A held key is seen until it is released, and a commit of the same key
// under way keeps it seen after the release; once committed it is seen
// from the file.
func TestHoldKeysSeenUntilReleased(t *testing.T) {
	e := open(t, nil)
	key := outbox.ScopedKey("n2", "actor", "k")
	seen := func() bool {
		t.Helper()
		ok, err := e.KeySeen(key)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	e.HoldKeys([][]byte{key})
	if !seen() {
		t.Fatal("a held key is not seen")
	}
	e.ReleaseKeys([][]byte{key})
	if seen() {
		t.Fatal("a released key, never committed, is still seen")
	}
	e.HoldKeys([][]byte{key})
	if err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: []byte("s"), Watermark: 1, Keys: [][]byte{key}}); err != nil {
		t.Fatal(err)
	}
	e.ReleaseKeys([][]byte{key})
	if !seen() {
		t.Fatal("a committed key is not seen")
	}
}

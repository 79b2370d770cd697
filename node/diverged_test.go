package node_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
)

// A sender restored from a backup of its outbox reuses sequences its
// receiver has seen. While the receiver is away the new messages queue and
// then go out in one emission that reaches past the receiver's watermark,
// so the watermark is not above everything the stream sent: the message
// at the watermark's sequence, another than the one that ran there, gives
// the restore away (DIVERGED). The stream starts a new epoch and every new
// message runs, in order; none is taken for a copy.
func TestRestoredSendersBurstPastTheWatermarkRuns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spawn func(n *node.Node, s *sink) error
	}{
		{"handler", func(n *node.Node, s *sink) error {
			_, err := n.Spawn("sink", s.handler)
			return err
		}},
		{"batch handler", func(n *node.Node, s *sink) error {
			_, err := n.Spawn("sink", s.handler, node.WithBatch(func(ctx context.Context, msgs []*node.Message) (int, error) {
				for i, m := range msgs {
					if _, err := s.handler(ctx, m); err != nil {
						return i, err
					}
				}
				return len(msgs), nil
			}, 16))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s sink
			burst := []string{"w", "x", "y", "z"} // under the sequences of b, c and two more
			n1, d2 := restoredBurst(t, func(*node.Config) {}, func(n *node.Node) error { return tc.spawn(n, &s) }, &s, burst, nil)
			n2 := newNode(t, "n2", d2, func(*node.Config) {}, n1.GossipAddr())
			if err := tc.spawn(n2, &s); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, 15*time.Second, "burst delivered", func() bool { return n1.Outbox().Stats().Depth == 0 })
			want := append([]string{"a", "b", "c"}, burst...)
			if got := s.values(); !slices.Equal(got, want) {
				t.Fatalf("sink ran %v, want %v", got, want)
			}
			if st := n2.Stats(); st.Diverged == 0 {
				t.Fatal("no message answered DIVERGED")
			}
			if dl := deadLetters(t, n1); len(dl) != 0 {
				t.Fatalf("dead letters %+v", dl)
			}
		})
	}
}

// restoredBurst runs a (sequence 1) from n1 to the sink on n2, which
// spawn spawns, backs n1's whole data directory up, runs b and c (2 and
// 3, the sink's watermark), then closes both nodes, restores the backup
// and starts n1 alone, where it queues burst (its receiver is down) under
// the sequences of b, c and more, each with the options opts gives (nil:
// none). It returns the restored n1 and n2's directory. edit changes n1's
// configuration.
func restoredBurst(t *testing.T, edit func(*node.Config), spawn func(*node.Node) error, s *sink, burst []string, opts func(v string) []node.SendOption) (*node.Node, string) {
	t.Helper()
	dir := t.TempDir()
	d1, d2 := filepath.Join(dir, "n1"), filepath.Join(dir, "n2")
	clk := clockNotSet()
	cfg := func(c *node.Config) { fastRetries(c); c.Outbox.SequenceBlock = 1; c.Outbox.Clock = clk; edit(c) }
	n2 := newNode(t, "n2", d2, func(*node.Config) {})
	if err := spawn(n2); err != nil {
		t.Fatal(err)
	}
	n1 := newNode(t, "n1", d1, cfg, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send := func(v string, o ...node.SendOption) node.Outcome {
		t.Helper()
		out, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String(v), o...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	send("a")
	s.waitLen(t, 1)
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	copyDir(t, d1, filepath.Join(dir, "backup"))
	n1 = newNode(t, "n1", d1, cfg, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send("b")
	send("c")
	s.waitLen(t, 3)
	testutil.WaitFor(t, 10*time.Second, "b, c acked", func() bool { return n1.Outbox().Stats().Depth == 0 })
	for _, n := range []*node.Node{n1, n2} {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(d1); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "backup"), d1) // the outbox goes back to before b and c

	n1 = newNode(t, "n1", d1, cfg)
	for _, v := range burst {
		var o []node.SendOption
		if opts != nil {
			o = opts(v)
		}
		if out := send(v, o...); out != node.Queued {
			t.Fatalf("%s with its receiver down: %v, want Queued", v, out)
		}
	}
	return n1, d2
}

// A release from before digests opens the same outbox file (its format did
// not change) and moves watermarks without a digest. After a rollback and
// a new upgrade, the digest on disk belongs to an older watermark: it must
// not be taken for the current one's, or a copy of the message at the
// current watermark (its receipt lost while the older release ran) would
// be answered DIVERGED and run again in a new epoch.
func TestCopyAtAWatermarkAnOlderReleaseMovedIsADuplicate(t *testing.T) {
	dir := t.TempDir()
	n := newNode(t, "n1", dir, func(*node.Config) {})
	var s sink
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	if rc := rs.deliverWait(t, n, stringEnv(t, 1, 0, "a")); rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("a: %v", rc.GetCode())
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// The older release runs message 2 "b" and moves the watermark to 2;
	// its receipt is lost.
	moveWatermarkAsAnOlderRelease(t, dir, 2)

	n = newNode(t, "n1", dir, func(*node.Config) {}) // this release again
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	cp := stringEnv(t, 2, 0, "b") // the sender's copy of b, in a new emission
	cp.MsgId += "-copy"
	if rc := rs.deliverWait(t, n, cp); rc.GetCode() != pb.Receipt_DUPLICATE {
		t.Fatalf("a copy of b, the message at the watermark: %v (%q), want DUPLICATE; Stats.Diverged=%d",
			rc.GetCode(), rc.GetMessage(), n.Stats().Diverged)
	}
}

// moveWatermarkAsAnOlderRelease moves the watermark of peer p's stream to
// sink@n1 in the closed node's outbox file in dir to w, as a release from
// before digests does: it writes the "in" record only, so the digest on
// disk is not w's.
func moveWatermarkAsAnOlderRelease(t *testing.T, dir string, w uint64) {
	t.Helper()
	key := outbox.StreamKey(peerP.Name, peerP.OutboxID, 0, "sink")
	db, err := bolt.Open(filepath.Join(dir, "outbox.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		in := tx.Bucket([]byte("in"))
		v := bytes.Clone(in.Get(key))
		if len(v) != 16 {
			return fmt.Errorf("no stream record (%d bytes)", len(v))
		}
		binary.BigEndian.PutUint64(v[:8], w)
		return in.Put(key, v)
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// A watermark an older release moved has no digest here. A copy of the
// message at it is a copy for the actor (nothing to compare it with), and
// so it is for the goroutine that receives it: while the store is stopped
// (the actor refuses every stream message then) it is still answered
// DUPLICATE, or its sender would never hear that it ran and would
// dead-letter it at its TTL as "outcome unknown".
func TestCopyAtADigestlessDurableWatermarkWhileTheStoreIsStopped(t *testing.T) {
	dir := t.TempDir()
	n := newNode(t, "n1", dir, func(*node.Config) {})
	var s sink
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	if rc := rs.deliverWait(t, n, stringEnv(t, 1, 0, "a")); rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("a: %v", rc.GetCode())
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	moveWatermarkAsAnOlderRelease(t, dir, 2) // it ran b (2); b's receipt was lost

	// This release again; then its disk fails a sync: the store stops.
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(filepath.Join(dir, "outbox.db"), syncErr, func(meta bool) bool { return meta && failing.Load() })()
	n = newNode(t, "n1", dir, func(*node.Config) {})
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	var other sink
	if _, err := n.Spawn("other", other.handler); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	o := stringEnv(t, 3, 0, "o")
	o.Recipient = "other@n1"
	n.DeliverIncoming(peerP, o, rs.reply("o-3"))
	testutil.WaitFor(t, 10*time.Second, "the store to stop", func() bool { return n.Outbox().Err() != nil })
	failing.Store(false)

	cp := stringEnv(t, 2, 0, "b") // the sender's copy of b, the message at the durable watermark
	cp.MsgId += "-copy"
	if rc := rs.deliverWait(t, n, cp); rc.GetCode() != pb.Receipt_DUPLICATE {
		t.Fatalf("a copy of b, the message at the durable watermark 2 (moved by an older release, no digest), while the store is stopped: %v (%q), want DUPLICATE (Stats: dedupe hits %d, store failed %d)",
			rc.GetCode(), rc.GetMessage(), n.Stats().DedupeHits, n.Stats().StoreFailed)
	}
}

// Sequences belong to the whole outbox, so a restored sender that also
// writes to another actor may give the sequence of the sink's watermark to
// that actor's message: the sink's burst then skips the watermark's
// sequence, and no digest can tell its messages below the watermark from
// copies. A sequence block starts no lower than the wall clock (in
// microseconds), so with a clock that moved on since the backup the
// restored outbox hands out no sequence again at all: the burst lies above
// the watermark, also when the other actor's message is delivered and gone
// before the sink's stream goes (nothing would show a reuse then). With a
// clock that tells nothing (before 1970, as on a device that has not set
// its clock), the sequences are the outbox's counter alone: when only
// outbox.db was restored from the backup (the data directory's other files
// kept, as after losing that one file), the sequence high-water recorded
// beside it keeps the restored outbox from handing out sequences again;
// when the whole data directory was restored, that record went back too,
// and the receipts give the restore away, since the watermark they carry
// lies between two messages of the emission, above anything the stream
// sent before it, and is none of them. Either way every message runs,
// once, in order.
func TestOutboxRestoredFromABackupHandsOutNoSequenceAgain(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	t.Run("outbox.db alone", func(t *testing.T) { restoredBurstAroundTheWatermark(t, backupCase{}) })
	t.Run("whole data directory", func(t *testing.T) { restoredBurstAroundTheWatermark(t, backupCase{wholeDir: true}) })
	// The receiver comes back before its actor does: the first emission
	// is refused (no such actor yet) and only the next one runs, which
	// must still give the restore away.
	t.Run("whole data directory, the actor back after a refusal", func(t *testing.T) {
		restoredBurstAroundTheWatermark(t, backupCase{wholeDir: true, lateActor: true})
	})
	t.Run("whole data directory, the clock moved on", func(t *testing.T) {
		restoredBurstAroundTheWatermark(t, backupCase{wholeDir: true, clockSet: true})
	})
	t.Run("whole data directory, the clock moved on, the other actor's message gone first", func(t *testing.T) {
		restoredBurstAroundTheWatermark(t, backupCase{wholeDir: true, clockSet: true, otherFirst: true})
	})
	// The restart between the backup and the restore skips the rest of a
	// block: with the clock set, a block is short whatever SequenceBlock
	// says, so that skip stays within milliseconds of the clock.
	t.Run("whole data directory, the clock moved on, the other actor's message gone first, blocks of 2^32", func(t *testing.T) {
		restoredBurstAroundTheWatermark(t, backupCase{wholeDir: true, clockSet: true, otherFirst: true, block: 1 << 32})
	})
}

// clockNotSet returns a clock whose wall clock reads before 1970, as a
// device's may before it first sets its clock: it puts no floor under the
// outbox's sequences, which are then its counter alone, so a sender
// restored from a backup of its whole data directory hands out sequences
// its receivers have seen.
func clockNotSet() *outbox.AdjustableClock {
	clk := outbox.NewAdjustableClock()
	clk.Step(-time.Since(time.Unix(0, 0)) - time.Hour)
	return clk
}

type backupCase struct {
	wholeDir   bool   // the data directory restored whole (else outbox.db alone)
	lateActor  bool   // the sink's first emission refused: no such actor yet
	clockSet   bool   // the system clock (else one before 1970: no floor under the sequences)
	otherFirst bool   // the other actor's message delivered (and gone) before the sink is back
	block      uint64 // Outbox.SequenceBlock (0: 1)
}

func restoredBurstAroundTheWatermark(t *testing.T, c backupCase) {
	dir := t.TempDir()
	d1, d2 := filepath.Join(dir, "n1"), filepath.Join(dir, "n2")
	clk := outbox.NewAdjustableClock()
	if !c.clockSet {
		clk = clockNotSet()
	}
	edit := func(cfg *node.Config) {
		fastRetries(cfg)
		cfg.Outbox.SequenceBlock, cfg.Outbox.Clock = max(c.block, 1), clk
		if c.otherFirst {
			cfg.Relay.BatchSize = 1 // w goes alone: its emission stops below the watermark
		}
	}
	var s, o sink
	spawn := func(n *node.Node, names ...string) {
		t.Helper()
		for _, name := range names {
			h := s.handler
			if name == "other" {
				h = o.handler
			}
			if _, err := n.Spawn(name, h); err != nil {
				t.Fatal(err)
			}
		}
	}
	n2 := newNode(t, "n2", d2, func(*node.Config) {})
	spawn(n2, "sink", "other")
	n1 := newNode(t, "n1", d1, edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send := func(to, v string) node.Outcome {
		t.Helper()
		out, err := n1.TellReliable(ctxT(t), node.Addr(to, "n2"), wrapperspb.String(v))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	send("sink", "a")
	s.waitLen(t, 1)
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	ob := filepath.Join(d1, "outbox.db")
	backup := filepath.Join(dir, "backup")
	if c.wholeDir {
		copyDir(t, d1, backup)
	} else {
		testutil.CopyFile(t, ob, backup)
	}
	n1 = newNode(t, "n1", d1, edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send("sink", "b")
	send("sink", "c") // the sink's watermark
	s.waitLen(t, 3)
	testutil.WaitFor(t, 10*time.Second, "b, c acked", func() bool { return n1.Outbox().Stats().Depth == 0 })
	for _, n := range []*node.Node{n1, n2} {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if c.wholeDir {
		if err := os.RemoveAll(d1); err != nil {
			t.Fatal(err)
		}
		copyDir(t, backup, d1)
	} else {
		testutil.CopyFile(t, backup, ob) // outbox.db alone goes back to before b and c
	}

	n1 = newNode(t, "n1", d1, edit)
	// Restored whole, with a clock that tells nothing, the outbox hands out b's sequence to w
	// and c's (the watermark's) to o: the sink's burst is [w, x, y] around
	// it.
	for _, m := range []struct{ to, v string }{{"sink", "w"}, {"other", "o"}, {"sink", "x"}, {"sink", "y"}} {
		if out := send(m.to, m.v); out != node.Queued {
			t.Fatalf("%s with its receiver down: %v, want Queued", m.v, out)
		}
	}
	if c.otherFirst {
		// A restart counts everything stored as sent: the watermark lies
		// below what the sink's stream sent, and gives nothing away.
		if err := n1.Close(); err != nil {
			t.Fatal(err)
		}
		n1 = newNode(t, "n1", d1, edit)
	}
	n2 = newNode(t, "n2", d2, func(*node.Config) {}, n1.GossipAddr())
	switch {
	case c.lateActor:
		testutil.WaitFor(t, 15*time.Second, "the burst refused: no such actor yet", func() bool { return n2.Stats().NoSuchActor > 0 })
		spawn(n2, "sink", "other")
	case c.otherFirst:
		spawn(n2, "other")
		o.waitLen(t, 1)
		testutil.WaitFor(t, 10*time.Second, "o acked and gone from the outbox", func() bool { return n1.Outbox().Stats().Depth == 3 })
		spawn(n2, "sink")
	default:
		spawn(n2, "sink", "other")
	}
	testutil.WaitFor(t, 15*time.Second, "burst delivered", func() bool { return n1.Outbox().Stats().Depth == 0 })
	if got, want := s.values(), []string{"a", "b", "c", "w", "x", "y"}; !slices.Equal(got, want) {
		t.Fatalf("sink ran %v, want %v", got, want)
	}
	if got := o.values(); !slices.Equal(got, []string{"o"}) {
		t.Fatalf("other ran %v, want [o]", got)
	}
	// Restored alone, or with a clock, the outbox reused no sequence:
	// nothing to find out.
	want := uint64(0)
	if c.wholeDir && !c.clockSet {
		want = 1
	}
	if got := n1.Outbox().Stats().Restores; got != want {
		t.Fatalf("restores %d, want %d", got, want)
	}
}

// A restored sender's emission [w (another message under the watermark's
// sequence 1), x (2, chained to 1)] reaches a receiver whose actor is
// backlogged: w marks the stream and is answered DIVERGED (once the mark
// is on disk; CAPACITY while the disk refuses it), x waits in the
// mailbox behind other work, and the stream is evicted from the cache
// meanwhile (nothing acquired it). The sender, told DIVERGED, sends both
// again in a new epoch, so x must not run in the old one: the mark is
// committed with the watermark and comes back with the stream. When the
// disk refuses the mark's commit for a moment, the mark (which does not
// move the watermark) is committed by the retry, and the stream stays
// cached until then.
func TestDivergedMarkOutlivesTheStreamsEviction(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		name := "evicted"
		if refuse {
			name = "evicted after a refused commit"
		}
		t.Run(name, func(t *testing.T) { divergedMarkEvicted(t, refuse) })
	}
}

func divergedMarkEvicted(t *testing.T, refuse bool) {
	dir := t.TempDir()
	n := newNode(t, "n1", dir, func(*node.Config) {})
	var mu sync.Mutex
	var ran []string
	gate, started := make(chan struct{}), make(chan struct{})
	var open sync.Once
	openGate := func() { open.Do(func() { close(gate) }) }
	t.Cleanup(openGate) // before the node's Close, which waits for the handler
	if _, err := n.Spawn("sink", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Envelope().GetBody().UnmarshalTo(&v); err != nil {
			return nil, err
		}
		if v.GetValue() == "slow" {
			close(started)
			<-gate
			return nil, nil
		}
		mu.Lock()
		ran = append(ran, v.GetValue())
		mu.Unlock()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	if rc := rs.deliverWait(t, n, stringEnv(t, 1, 0, "a")); rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("a: %v", rc.GetCode())
	}
	restore, hits := func() {}, func() int { return 0 }
	if refuse {
		restore, hits = faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
		defer restore() // idempotent
	}
	// The restored sender's emission, with another sender's slow message
	// posted in between (the actor's mailbox interleaves senders).
	slow := stringEnv(t, 1, 0, "slow")
	slow.StreamEpoch = 99
	n.DeliverIncoming(peerP, stringEnv(t, 1, 0, "w"), rs.reply("w-1"))
	n.DeliverIncoming(peerP, slow, rs.reply("slow-1"))
	n.DeliverIncoming(peerP, stringEnv(t, 2, 1, "x"), rs.reply("x-2"))
	<-started
	// Answered once the mark is on disk: DIVERGED, or CAPACITY while the
	// disk refuses it.
	testutil.WaitFor(t, 5*time.Second, "w's receipt", func() bool { return rs.marked("w-1") })
	if c, want := rs.code("w-1"), pb.Receipt_DIVERGED; refuse && c != pb.Receipt_CAPACITY || !refuse && c != want {
		t.Fatalf("w: %v, want DIVERGED (CAPACITY while the disk refuses the mark)", c)
	}
	if refuse {
		testutil.WaitFor(t, 5*time.Second, "the mark's commit refused", func() bool { return hits() > 0 })
		restore() // the disk has room again
	}
	// x waits in the mailbox past the cache's idle time (10 minutes; at
	// once here).
	testutil.WaitFor(t, 5*time.Second, "the diverged stream evicted", func() bool {
		return n.EvictIdleStreams(0) > 0
	})
	openGate()
	testutil.WaitFor(t, 5*time.Second, "x's receipt", func() bool { return rs.len() == 4 })
	mu.Lock()
	defer mu.Unlock()
	if c := rs.code("x-2"); c != pb.Receipt_DIVERGED || slices.Contains(ran, "x") {
		t.Fatalf("x, sent after w in the emission answered DIVERGED: %v, sink ran %v (commits refused: %d); want DIVERGED and x not run (its sender sends it again after w in a new epoch)", c, ran, hits())
	}
}

// stringEnv is message seq of peer p's stream (epoch 0) to sink@n1,
// chained to prev, carrying v; its msg id is v-seq. Messages with other
// values differ in their digest; a copy differs only in its msg id.
func stringEnv(tb testing.TB, seq, prev uint64, v string) *pb.Envelope {
	tb.Helper()
	env := streamEnv("sink", "n1", seq, prev)
	env.MsgId, env.CreatedAtUnixMs = fmt.Sprintf("%s-%d", v, seq), 1000
	body, err := anypb.New(wrapperspb.String(v))
	if err != nil {
		tb.Fatal(err)
	}
	env.Body = body
	return env
}

package node_test

// Real two-node runs: a sender restored from a backup of its whole data
// directory sends a burst that straddles the receiver's watermark while the
// receiver's actor is busy, and every message of the burst still runs.

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// restoredBurstMeetingABusyActor runs a (seq 1), takes a backup of the
// sender's whole data directory, runs b (2) and c (3: the receiver's
// watermark), restores the backup and queues the burst w x y z (2..5)
// while the receiver is down. The receiver comes back; once the burst was
// refused (no such actor yet) the sink is spawned with opts, its actor is
// held by a local tell, fills are told (they wait in the mailbox), and
// whileHeld waits for what the test needs before the actor is released.
// Every message must run once, in order (fills aside).
func restoredBurstMeetingABusyActor(t *testing.T, opts []node.SpawnOption, edit func(*node.Config), fills int, whileHeld func(t *testing.T, n1, n2 *node.Node)) {
	s := newHoldSink("hold")
	burst := []string{"w", "x", "y", "z"} // under the sequences of b, c (the watermark) and two more
	n1, d2 := restoredBurst(t, edit, func(n *node.Node) error { _, err := n.Spawn("sink", s.handler); return err }, &s.sink, burst, nil)
	n2, release := meetBusyActor(t, n1, d2, s, opts, fills)
	defer release()
	whileHeld(t, n1, n2)
	release()
	testutil.WaitFor(t, 20*time.Second, "burst delivered", func() bool { return n1.Outbox().Stats().Depth == 0 })
	got := slices.DeleteFunc(s.values(), func(v string) bool { return v == "fill" || v == "hold" })
	if want := append([]string{"a", "b", "c"}, burst...); !slices.Equal(got, want) {
		t.Fatalf("sink ran %v, want %v (n2 stats: diverged %d, dedupe hits %d, refused full %d, dropped %d; n1 restores %d)",
			got, want, n2.Stats().Diverged, n2.Stats().DedupeHits, n2.Stats().RefusedFull, n2.Stats().Dropped, n1.Outbox().Stats().Restores)
	}
	if dl := deadLetters(t, n1); len(dl) != 0 {
		t.Fatalf("dead letters %+v", dl)
	}
}

// meetBusyActor starts the receiver n2 in d2, with n1 as its seed. Once
// n1's queued messages were answered (no such actor yet, within the spawn
// grace: they come back after up to a second; or DIVERGED, judged by the
// stream's watermark on disk), the sink is spawned with
// opts, its actor is held by a local tell and fills are told (they wait
// in the mailbox). release lets the actor go; calling it again does
// nothing.
func meetBusyActor(t *testing.T, n1 *node.Node, d2 string, s *holdSink, opts []node.SpawnOption, fills int) (*node.Node, func()) {
	t.Helper()
	n2 := newNode(t, "n2", d2, func(*node.Config) {}, n1.GossipAddr())
	testutil.WaitFor(t, 15*time.Second, "the burst answered before the actor is there", func() bool {
		// No such actor yet, or found divergent from the stream's
		// watermark on disk, as the actor would find it.
		return n2.Stats().NoSuchActor > 0 || n2.Stats().Diverged > 0
	})
	if _, err := n2.Spawn("sink", s.handler, opts...); err != nil {
		t.Fatal(err)
	}
	release := func() { s.free("hold") }
	sinkAddr := node.Addr("sink", "n2")
	if err := n2.Tell(ctxT(t), sinkAddr, wrapperspb.String("hold")); err != nil {
		t.Fatal(err)
	}
	<-s.started["hold"]
	for range fills {
		if err := n2.Tell(ctxT(t), sinkAddr, wrapperspb.String("fill")); err != nil {
			release()
			t.Fatal(err)
		}
	}
	return n2, release
}

// The restored sender's burst [w x y z] reaches the receiver while its
// actor's mailbox is full. w, below the durable watermark, is answered
// DUPLICATE without a look; x, at the watermark, has no room. x is
// answered DIVERGED (and w's receipt gives the digest of c, which ran at
// the watermark), so the sender does not take w for a copy.
func TestRestoredBurstMeetingAFullMailboxRuns(t *testing.T) {
	restoredBurstMeetingABusyActor(t, []node.SpawnOption{node.WithMailbox(1, mailbox.Reject)}, func(*node.Config) {}, 1,
		func(t *testing.T, n1, n2 *node.Node) {
			// The burst came back while the mailbox was full.
			testutil.WaitFor(t, 15*time.Second, "the burst met the full mailbox", func() bool {
				return n2.Stats().RefusedFull > 0 || n2.Stats().Diverged > 0
			})
			// And it was judged: the next emission came (w answered a
			// copy again, or x refused again) or w was acked.
			testutil.WaitFor(t, 15*time.Second, "the emission judged", func() bool {
				return n1.Outbox().Stats().Depth < 4 || n2.Stats().RefusedFull > 1 || n2.Stats().DedupeHits > 1 || n1.Outbox().Stats().Restores > 0
			})
		})
}

// The same burst meets an actor whose mailbox drops its oldest message when
// full (WithMailbox(1, DropOldest)): x, the message at the watermark, is
// queued, then evicted by y (and y by z). Its CAPACITY receipt comes from
// the mailbox's drop, which never compares it with the digest at the
// watermark; w's DUPLICATE gives that digest (c's), and the sender, which
// sent x under c's sequence in the same emission, starts a new epoch.
func TestRestoredBurstWhoseWatermarkMessageIsDroppedOldestRuns(t *testing.T) {
	restoredBurstMeetingABusyActor(t, []node.SpawnOption{node.WithMailbox(1, mailbox.DropOldest)}, func(*node.Config) {}, 0,
		func(t *testing.T, n1, n2 *node.Node) {
			testutil.WaitFor(t, 15*time.Second, "x and y evicted from the mailbox", func() bool {
				return n2.Stats().Dropped >= 2 || n2.Stats().Diverged > 0
			})
		})
}

// The same burst meets an actor busy for longer than the sender's
// DeliverTimeout: w is answered DUPLICATE at once, x waits in the mailbox
// behind the busy handler, and the emission is judged with x's receipt
// missing. w's DUPLICATE gives the digest of c, the message at the
// watermark, which is not x: a new epoch, and w is not taken for a copy.
func TestRestoredBurstOutwaitingTheDeliverTimeoutRuns(t *testing.T) {
	restoredBurstMeetingABusyActor(t, nil, func(c *node.Config) { c.Relay.DeliverTimeout = 300 * time.Millisecond }, 0,
		func(t *testing.T, n1, n2 *node.Node) {
			testutil.WaitFor(t, 15*time.Second, "the emission timed out and was judged", func() bool {
				return n1.Outbox().Stats().Depth < 4 || n2.Stats().DedupeHits > 1 || n1.Outbox().Stats().Restores > 0
			})
		})
}

// While a newer watermark is not durable (its commit under way, or, as
// here, refused by a full disk and retried), a message at the durable
// watermark's sequence reaches the actor, which answers it DUPLICATE with
// the durable watermark, its own sequence. A sender restored from a backup
// taken before a, whose emission is [a2] (another message under a's
// sequence), must not take that for a copy: the receipt gives the digest
// of a, kept with the durable watermark, which is not a2's.
func TestAnotherMessageAtTheDurableWatermarkIsNotACopyWhileANewerOneIsNotDurable(t *testing.T) {
	a := stringEnv(t, 1, 0, "a")
	n, rs, s := receiverRefusingAWatermark(t, []*pb.Envelope{a}, stringEnv(t, 2, 1, "b"))
	a2 := stringEnv(t, 1, 0, "a2")
	rc := rs.deliverWait(t, n, a2)
	if rc.GetCode() == pb.Receipt_DUPLICATE && (rc.GetWatermarkDigest() != pb.StreamDigest(a) || rc.GetWatermark() != 1) {
		t.Fatalf("a2, another message under a's sequence (the durable watermark), while b's watermark is not durable: DUPLICATE with watermark %d and digest %#x, want a's %#x at 1 (a2's is %#x); its sender would ack it as a copy (sink ran %v)",
			rc.GetWatermark(), rc.GetWatermarkDigest(), pb.StreamDigest(a), pb.StreamDigest(a2), s.values())
	}
}

// While a newer watermark is not durable (its commit refused by the disk),
// a copy is answered DUPLICATE at once with the durable watermark and the
// digest of the message that ran there: kept with the durable watermark,
// so that a restored sender still learns whether the message it holds
// there is the one that ran, and an honest sender acks its copy instead
// of waiting, as long as the disk refuses, for its TTL to run out.
func TestCopyIsAnsweredWithTheDurableWatermarksDigest(t *testing.T) {
	b := stringEnv(t, 2, 1, "b")
	n, rs, _ := receiverRefusingAWatermark(t, []*pb.Envelope{stringEnv(t, 1, 0, "a"), b}, stringEnv(t, 3, 2, "c"))
	for _, env := range []*pb.Envelope{stringEnv(t, 1, 0, "a"), stringEnv(t, 2, 1, "b")} {
		env.MsgId += "-copy" // below the durable watermark, and at it
		rc := rs.deliverWait(t, n, env)
		if rc.GetCode() != pb.Receipt_DUPLICATE || rc.GetWatermark() != 2 || rc.GetWatermarkDigest() != pb.StreamDigest(b) {
			t.Fatalf("%s while c's watermark is not durable: %v, watermark %d, digest %#x; want DUPLICATE, 2, %#x",
				env.GetMsgId(), rc.GetCode(), rc.GetWatermark(), rc.GetWatermarkDigest(), pb.StreamDigest(b))
		}
	}
}

// receiverRefusingAWatermark starts a node whose sink runs ran, each
// answered PROCESSED, then has its disk refuse every commit and delivers
// refused, which runs and whose watermark the disk refuses (CAPACITY).
func receiverRefusingAWatermark(t *testing.T, ran []*pb.Envelope, refused *pb.Envelope) (*node.Node, *receipts, *sink) {
	t.Helper()
	dir := t.TempDir()
	n := startNode(t, "n1", dir)
	s := &sink{}
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	rs := &receipts{}
	for _, env := range ran {
		if code := rs.deliverWait(t, n, env).GetCode(); code != pb.Receipt_PROCESSED {
			t.Fatalf("%s: %v, want PROCESSED", env.GetMsgId(), code)
		}
	}
	restore, _ := faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
	t.Cleanup(restore)
	if code := rs.deliverWait(t, n, refused).GetCode(); code != pb.Receipt_CAPACITY {
		t.Fatalf("%s, its watermark refused by the disk: %v, want CAPACITY", refused.GetMsgId(), code)
	}
	return n, rs, s
}

// The restored sender's burst [w x y z] meets a full mailbox: w (2) is
// answered DUPLICATE with c's digest, x, y, z DIVERGED (refused for room,
// at and after the watermark) and the stream is marked. The sender finds
// the restore, but its disk refuses the new epoch, so it sends again in
// the old one; while the disk refuses, x, y and z run out of their TTL,
// and are given up once it takes writes again. The next emission, still
// in the old epoch, is [w], below the durable watermark. The stream is
// marked: w is answered DIVERGED, as the actor answers every message of a
// marked stream, not DUPLICATE (the digest could not help: x, the
// message the sender held under 3, is gone from its outbox, and its
// emitted high-water covers the watermark). w goes again in a new epoch
// and runs.
func TestCopyOnAStreamMarkedDivergedIsNotAcked(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	const ttl = 3 * time.Second
	s := newHoldSink("hold")
	n1, d2 := restoredBurst(t, func(c *node.Config) { c.Outbox.MaxClockSkew = 100 * time.Millisecond },
		func(n *node.Node) error { _, err := n.Spawn("sink", s.handler); return err }, &s.sink, []string{"w", "x", "y", "z"},
		func(v string) []node.SendOption {
			if v == "w" {
				return nil
			}
			return []node.SendOption{node.WithTTL(ttl)}
		})
	queued := time.Now() // x, y, z were queued before
	// n1's disk refuses commits from now on: the new epoch it will want.
	restoreDisk, hits := faults.FailCommits(filepath.Join(filepath.Dir(d2), "n1", "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restoreDisk()

	n2, release := meetBusyActor(t, n1, d2, s, []node.SpawnOption{node.WithMailbox(1, mailbox.Reject)}, 1)
	defer release()
	testutil.WaitFor(t, 15*time.Second, "x answered DIVERGED and the new epoch refused by n1's disk", func() bool {
		return n2.Stats().Diverged > 0 && hits() > 0
	})
	// x, y, z run out of TTL while the disk refuses (they cannot be given
	// up meanwhile: that is a write too).
	testutil.WaitFor(t, 15*time.Second, "x, y, z past their TTL", func() bool { return time.Since(queued) > ttl+500*time.Millisecond })
	restoreDisk()
	release()
	testutil.WaitFor(t, 15*time.Second, "the queue settled", func() bool { return n1.Outbox().Stats().Depth == 0 })
	testutil.WaitFor(t, 5*time.Second, "the fill ran", func() bool { return slices.Contains(s.values(), "fill") })
	got := slices.DeleteFunc(s.values(), func(v string) bool { return v == "fill" || v == "hold" })
	var dead []string
	for _, dl := range deadLetters(t, n1) {
		var v wrapperspb.StringValue
		if err := dl.Message.GetEnvelope().GetBody().UnmarshalTo(&v); err == nil {
			dead = append(dead, v.GetValue())
		}
	}
	if !slices.Contains(got, "w") && !slices.Contains(dead, "w") {
		t.Fatalf("w was acked (n1's outbox is empty) but never ran: sink ran %v, dead letters %v (n2: diverged %d, dedupe hits %d, refused full %d; n1 restores %d, refused commits %d)",
			got, dead, n2.Stats().Diverged, n2.Stats().DedupeHits, n2.Stats().RefusedFull, n1.Outbox().Stats().Restores, hits())
	}
}

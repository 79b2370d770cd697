package node_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// storedIn counts, per msg id, the messages stored in st's "box".
func storedIn(t *testing.T, st *inbox.Store) map[string]int {
	t.Helper()
	envs, err := st.Pull(context.Background(), "box", 0, 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, e := range envs {
		got[e.GetMsgId()]++
	}
	return got
}

// The inbox stored p#2 and p#3, then the node went down before their
// watermark was committed (the crash WithApplied is for): outbox.db says
// w=1, the inbox's record says 3. The stream then idles past its
// retention and the node forgets it with the horizon 1 (its own
// watermark). A late copy of p#2 (its receipt lost, its sender's clock
// undercounting its age: the premise of
// TestForgottenStreamRefusesWhatMayHaveRun) is above the horizon and runs:
// the inbox must still have its record of 3, above the forgotten
// watermark, and skip the copy.
func TestForgettingAStreamKeepsAnInboxRecordAheadOfIt(t *testing.T) {
	dir := t.TempDir()
	st := openBox(t, filepath.Join(dir, "inbox.db"))
	clk := outbox.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	// What the node forgets is handed to the inbox here, as the daemon's
	// Forgetter does off the committer.
	forgotten := make(chan []outbox.ForgottenStream, 16)
	start := func() *node.Node {
		n := startNodeWith(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
			c.Outbox.Clock = clk
			c.Outbox.OnForget = func(fs []outbox.ForgottenStream) {
				forgotten <- slices.Clone(fs)
			}
		})
		spawnBox(t, n, st)
		return n
	}
	n := start()
	var rs receipts
	if rc := rs.deliverWait(t, n, streamEnv("box", "n1", 1, 0)); rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("p#1: %v", rc.GetCode())
	}
	// The crash: the inbox stores p#2, p#3; outbox.db refuses their watermark.
	restore, hits := faults.FailCommits(filepath.Join(dir, "n1", "outbox.db"), errors.New("crash before the watermark's commit"))
	n.DeliverIncoming(peerP, streamEnv("box", "n1", 2, 1), func(*pb.Receipt) {})
	n.DeliverIncoming(peerP, streamEnv("box", "n1", 3, 2), func(*pb.Receipt) {})
	testutil.WaitFor(t, 10*time.Second, "p#2, p#3 stored, their watermark refused", func() bool {
		return st.Stats()["box"].LastCursor == 3 && hits() >= 1
	})
	_ = n.Close()
	restore()
	key := outbox.StreamKey("p", peerP.OutboxID, 0, "box")
	if a := st.Applied(key); a != 3 {
		t.Fatalf("inbox mark %d, want 3", a)
	}
	n = start()
	// A month idle; another stream's commit forgets p's stream.
	clk.Advance(31 * 24 * time.Hour)
	commitOtherStream(t, n, "box")
	forgetP(t, st, forgotten, key, 1)
	// The late copy of p#2.
	rc := rs.deliverWait(t, n, streamEnv("box", "n1", 2, 0)) // first of its emission
	got := storedIn(t, st)
	t.Logf("copy of p#2: %v (watermark %d); stored %v; inbox mark now %d", rc.GetCode(), rc.GetWatermark(), got, st.Applied(key))
	if got["m2"] != 1 {
		t.Fatalf("p#2 stored %d times in the inbox (receipt of its copy %v), want once: its record of 3 is above the forgotten watermark 1", got["m2"], rc.GetCode())
	}
}

// A message of a stream arrives just inside its retention: the inbox
// stores p#2 (record 2) and, before the node commits p#2's watermark,
// another stream's commit finds p's record (last changed at p#1) past its
// retention and forgets it. The inbox's record of 2 was written after the
// forget and is above the forgotten watermark (1): it must stay. The node
// then goes down before its commit of p#2; back up, the copy of p#2 is
// above the horizon (1) and must be skipped by the inbox, not stored twice.
func TestForgettingAStreamKeepsAnInboxRecordWrittenAfterIt(t *testing.T) {
	dir := t.TempDir()
	st := openBox(t, filepath.Join(dir, "inbox.db"))
	clk := outbox.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	// What the node forgets is handed to the inbox here, as the daemon's
	// Forgetter does off the committer.
	forgotten := make(chan []outbox.ForgottenStream, 16)
	stored := make(chan struct{}, 1)
	var gate chan struct{} // set before a delivery: the batch handler waits on it after storing
	start := func() *node.Node {
		n := startNodeWith(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
			c.Outbox.Clock = clk
			c.Outbox.OnForget = func(fs []outbox.ForgottenStream) {
				forgotten <- slices.Clone(fs)
			}
		})
		store := inbox.BatchHandler(st, "box")
		g := gate
		if _, err := n.Spawn("box", inbox.Handler(st, "box"), node.WithApplied(inbox.Applied(st)),
			node.WithBatch(func(ctx context.Context, msgs []*node.Message) (int, error) {
				k, err := store(ctx, msgs)
				if g != nil {
					stored <- struct{}{}
					<-g // the handler's return, and the watermark's commit, come later
				}
				return k, err
			}, inbox.ActorBatch)); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := start()
	var rs receipts
	if rc := rs.deliverWait(t, n, streamEnv("box", "n1", 1, 0)); rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("p#1: %v", rc.GetCode())
	}
	_ = n.Close()
	gate = make(chan struct{})
	n = start()
	key := outbox.StreamKey("p", peerP.OutboxID, 0, "box")
	clk.Advance(30*24*time.Hour - time.Second) // p#2 comes just inside the retention
	n.DeliverIncoming(peerP, streamEnv("box", "n1", 2, 1), func(*pb.Receipt) {})
	select {
	case <-stored:
	case <-time.After(10 * time.Second):
		t.Fatal("p#2 not stored")
	}
	if a := st.Applied(key); a != 2 {
		t.Fatalf("inbox mark %d after p#2 stored, want 2", a)
	}
	// Two seconds on, another stream's commit forgets p's stream.
	clk.Advance(2 * time.Second)
	commitOtherStream(t, n, "a")
	forgetP(t, st, forgotten, key, 1)
	// The node goes down before p#2's watermark is committed.
	restore, hits := faults.FailCommits(filepath.Join(dir, "n1", "outbox.db"), errors.New("crash before the watermark's commit"))
	close(gate)
	testutil.WaitFor(t, 10*time.Second, "p#2's watermark refused", func() bool { return hits() >= 1 })
	_ = n.Close()
	restore()
	gate = nil
	n = start()
	rc := rs.deliverWait(t, n, streamEnv("box", "n1", 2, 0)) // p#2 again, first of its emission
	got := storedIn(t, st)
	t.Logf("copy of p#2: %v (watermark %d); stored %v", rc.GetCode(), rc.GetWatermark(), got)
	if got["m2"] != 1 {
		t.Fatalf("p#2 stored %d times in the inbox, want once: its record was written after the forget, above the forgotten watermark", got["m2"])
	}
}

// forgetP waits for the node to forget stream key with watermark w and
// hands what it forgot to the inbox.
func forgetP(t *testing.T, st *inbox.Store, forgotten chan []outbox.ForgottenStream, key []byte, w uint64) {
	t.Helper()
	for {
		select {
		case fs := <-forgotten:
			if err := st.ForgetStreams(fs); err != nil {
				t.Fatal(err)
			}
			for _, f := range fs {
				if bytes.Equal(f.Stream, key) {
					if f.Watermark != w {
						t.Fatalf("p's stream forgotten with watermark %d, want %d", f.Watermark, w)
					}
					return
				}
			}
		case <-time.After(5 * time.Second):
			t.Fatal("p's stream not forgotten")
		}
	}
}

// commitOtherStream delivers message 1 of peer q's stream to actor on n and
// waits for its receipt: a commit of n's outbox, whose housekeeping
// forgets the streams idle past their retention.
func commitOtherStream(t *testing.T, n *node.Node, actor string) {
	t.Helper()
	q := transport.PeerInfo{Name: "q", OutboxID: [16]byte{'q'}}
	qe := streamEnv(actor, "n1", 1, 0)
	qe.Sender, qe.MsgId = "@q", "q1"
	var rq receipts
	n.DeliverIncoming(q, qe, rq.reply("q1"))
	testutil.WaitFor(t, 5*time.Second, "q#1's receipt", func() bool { return rq.len() == 1 })
}

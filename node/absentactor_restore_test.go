package node_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/testnet"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A sender restored from a backup of its whole data directory (its clock
// not set, so its sequences go back) sends new messages w and x under the
// sequences of b and c, which ran (c is the receiver's watermark), through
// a forwarder (whose receipts carry no watermark digest), to an actor that
// is stopped for the moment. x, at the watermark with other contents, is
// answered DIVERGED whether the actor is there or not, and the sender
// sends the whole emission again in a new epoch: w must run. When the
// actor was not there, x was answered NO_SUCH_ACTOR and w DUPLICATE, and w
// was acknowledged without ever running.
func TestNewMessageOfARestoredSenderForwardedToAnAbsentActorRuns(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	t.Run("actor present", func(t *testing.T) { forwardedRestore(t, false) })
	t.Run("actor absent", func(t *testing.T) { forwardedRestore(t, true) })
}

func forwardedRestore(t *testing.T, absent bool) {
	const a, fwd, cc = 0, 1, 2
	s := &runLog{}
	clk := clockNotSet()
	c := testnet.New(t, 3,
		testnet.WithConfig(func(i int, cfg *node.Config) {
			cfg.Transport.HandshakeTimeout = 500 * time.Millisecond
			cfg.Transport.KeepAlivePeriod = 200 * time.Millisecond
			cfg.Transport.MaxIdleTimeout = time.Second
			cfg.Relay.Backoff = partition.BackoffConfig{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}
			cfg.Relay.Forward = partition.ForwardConfig{After: 2, Probe: time.Hour}
			if i == a {
				cfg.Outbox.SequenceBlock = 1
				cfg.Outbox.Clock = clk
			}
		}),
		testnet.WithSpawn(func(i int, nd *node.Node) error {
			if i == a {
				return nil
			}
			if _, err := nd.Spawn("sink", s.handler); err != nil {
				return err
			}
			_, err := nd.Spawn("warm", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil })
			return err
		}))
	send := func(v uint64) node.Outcome {
		t.Helper()
		out, err := c.Node(a).TellReliable(ctxT(t), c.Addr("sink", cc), wrapperspb.UInt64(v))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	waitRan := func(n int) {
		t.Helper()
		testutil.WaitFor(t, 20*time.Second, "sink ran", func() bool { seqs, _ := s.snapshot(); return len(seqs) >= n })
	}
	if out := send(1); out != node.Delivered { // a
		t.Fatalf("a: %v", out)
	}
	waitRan(1)
	if err := c.Stop(a); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backup")
	copyDir(t, c.DataDir(a), backup)
	if err := c.Restart(a); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	send(2) // b
	send(3) // c: the sink's watermark
	waitRan(3)
	testutil.WaitFor(t, 10*time.Second, "b, c acked", func() bool { return c.Node(a).Outbox().Stats().Depth == 0 })
	if err := c.Stop(a); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.DataDir(a)); err != nil {
		t.Fatal(err)
	}
	copyDir(t, backup, c.DataDir(a)) // back to before b and c

	// The sink is stopped for a while (a redeploy), and A reaches C only
	// through the forwarder.
	warm(t, c, cc, fwd)
	if absent {
		if err := c.Node(cc).Stop("sink"); err != nil {
			t.Fatal(err)
		}
	}
	c.Cut(a, cc)
	if err := c.Restart(a); err != nil {
		t.Fatal(err)
	}
	send(4) // w, under b's sequence
	send(5) // x, under c's (the watermark's)
	// C answers the emission through the forwarder.
	testutil.WaitFor(t, 30*time.Second, "the forwarded emission answered at C", func() bool {
		st := c.Node(cc).Stats()
		return st.Forward.Accepted >= 2 && (!absent || st.NoSuchActor > 0)
	})
	t.Logf("depth after the forwarded emission: %d; A forward %+v; C stats dedupe=%d nosuchactor=%d",
		c.Node(a).Outbox().Stats().Depth, c.Node(a).Stats().Forward, c.Node(cc).Stats().DedupeHits, c.Node(cc).Stats().NoSuchActor)
	// The sink comes back; whatever is still queued goes.
	if absent {
		if _, err := c.Node(cc).Spawn("sink", s.handler); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "A's outbox drained", func() bool { return c.Node(a).Outbox().Stats().Depth == 0 })
	testutil.WaitFor(t, 10*time.Second, "x ran", func() bool { seqs, _ := s.snapshot(); return slices.Contains(seqs, 5) })
	seqs, _ := s.snapshot()
	t.Logf("restores %d, dead letters %v", c.Node(a).Outbox().Stats().Restores, deadLetters(t, c.Node(a)))
	if !slices.Contains(seqs, 4) {
		t.Fatalf("sink ran %v: w (4), a new message of the restored sender, was acknowledged (outbox empty, no dead letter) but never ran", seqs)
	}
}

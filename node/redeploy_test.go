package node_test

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A reliable message for an actor that stopped a moment ago (a redeploy:
// stopped, then spawned again) is answered "not yet" (NO_SUCH_ACTOR with a
// retry hint, which its sender waits out without counting an attempt),
// as one for an actor not yet spawned is after the node's start: counted,
// "no such actor" answers during a redeploy dead-lettered healthy
// messages of a sender that retried quickly. Past SpawnGrace since the
// stop, and for a name that never ran here, the answer counts again.
func TestMessageForAnActorBeingRedeployedIsAnsweredNotYet(t *testing.T) {
	const grace = 1500 * time.Millisecond
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.SpawnGrace = grace })
	var rs receipts
	seq := uint64(0)
	send := func(to string) *pb.Receipt {
		seq++
		env := stringEnv(t, seq, 0, "v")
		env.Recipient = to + "@n1"
		env.MsgId = env.GetMsgId() + "-" + to
		return rs.deliverWait(t, n, env)
	}
	// Past the node's own start-up grace: a name that never ran counts.
	testutil.WaitFor(t, 10*time.Second, "the start-up grace over", func() bool {
		rc := send("never")
		return rc.GetCode() == pb.Receipt_NO_SUCH_ACTOR && rc.GetRetryAfterMs() == 0
	})
	var s sink
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	if err := n.Stop("sink"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	rc := send("sink")
	if rc.GetCode() != pb.Receipt_NO_SUCH_ACTOR || rc.GetRetryAfterMs() <= 0 {
		t.Fatalf("message for an actor stopped %v ago: %v retry %d ms, want NO_SUCH_ACTOR with a retry hint (not yet)", time.Since(stopped), rc.GetCode(), rc.GetRetryAfterMs())
	}
	if rc := send("never"); rc.GetRetryAfterMs() != 0 {
		t.Fatalf("a name that never ran: retry %d ms, want 0 (counted)", rc.GetRetryAfterMs())
	}
	testutil.WaitFor(t, 10*time.Second, "the grace since the stop over", func() bool {
		rc := send("sink")
		return rc.GetCode() == pb.Receipt_NO_SUCH_ACTOR && rc.GetRetryAfterMs() == 0
	})
	if time.Since(stopped) < grace-100*time.Millisecond { // the node's clock reads milliseconds
		t.Fatalf("counted again %v after the stop, before the grace of %v", time.Since(stopped), grace)
	}
	// Spawned again: it runs what comes.
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	if rc := send("sink"); rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("after the respawn: %v %q", rc.GetCode(), rc.GetMessage())
	}
}

package node_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A receiver restarted with its wall clock stepped forward (NTP on a
// device without a real-time clock) used to count MaxDowntime (a day) of
// time that never passed, and with it forget every idempotency key of the
// last KeyWindow (a day): the application's retry under the same key, sent
// seconds later, ran a second time. Within one boot the store now counts
// the time it was closed on the boot's clock.
func TestWallStepAtReceiverRestartKeepsIdempotencyKeys(t *testing.T) {
	dir := t.TempDir()
	clk2 := outbox.NewAdjustableClock()
	edit2 := func(c *node.Config) { fastRetries(c); c.Outbox.Clock = clk2 }
	n2 := newNode(t, "n2", filepath.Join(dir, "n2"), edit2)
	var s sink
	if _, err := n2.Spawn("pay", s.handler); err != nil {
		t.Fatal(err)
	}
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send := func(v string, opts ...node.SendOption) {
		t.Helper()
		if _, err := n1.TellReliable(ctxT(t), node.Addr("pay", "n2"), wrapperspb.String(v), opts...); err != nil {
			t.Fatal(err)
		}
	}
	send("charge order-42", node.WithIdempotencyKey("order-42"))
	s.waitLen(t, 1)

	// The receiver restarts; NTP stepped its wall clock meanwhile. Only
	// moments pass in reality.
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	clk2.Step(10 * 365 * 24 * time.Hour)
	n2 = newNode(t, "n2", filepath.Join(dir, "n2"), edit2, n1.GossipAddr())
	if _, err := n2.Spawn("pay", s.handler); err != nil {
		t.Fatal(err)
	}
	waitAlive(t, []*node.Node{n1, n2}, 2)

	// The application retries its request under the same key, then sends a
	// sentinel on the same stream (it runs only after the retry is decided).
	send("charge order-42", node.WithIdempotencyKey("order-42"))
	send("sentinel")
	s.waitLen(t, 2)
	testutil.WaitFor(t, 15*time.Second, "sentinel", func() bool {
		v := s.values()
		return v[len(v)-1] == "sentinel"
	})
	got := s.values()
	if n := strings.Count(strings.Join(got, "|"), "charge order-42"); n != 1 {
		t.Fatalf("handler ran %v: the key order-42 ran %d times, seconds apart (a wall-clock step at the receiver's restart forgot the key window)", got, n)
	}
}

// A sender restarted with its wall clock stepped forward used to
// dead-letter a queued message whose TTL (1 h) had not run out in reality
// (a day of made-up downtime): it was queued for a peer that is offline and
// joins moments later, which would have run it.
func TestWallStepAtSenderRestartExpiresNoHealthyMessage(t *testing.T) {
	dir := t.TempDir()
	clk1 := outbox.NewAdjustableClock()
	edit1 := func(c *node.Config) { fastRetries(c); c.Outbox.Clock = clk1 }
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), edit1)
	if out, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String("a"), node.WithTTL(time.Hour)); err != nil || out != node.Queued {
		t.Fatalf("TellReliable = %v, %v", out, err)
	}
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	clk1.Step(10 * 365 * 24 * time.Hour)
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), edit1)
	var s sink
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "delivered or dead-lettered", func() bool {
		return len(s.values()) == 1 || len(deadLetters(t, n1)) == 1
	})
	if dl := deadLetters(t, n1); len(dl) != 0 {
		t.Fatalf("dead-lettered the message to %s (reason %q) seconds after it was queued with a 1 h TTL: the restart counted a wall-clock step as elapsed time",
			dl[0].Recipient, dl[0].Reason)
	}
}

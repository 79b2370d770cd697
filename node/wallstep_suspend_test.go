package node_test

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// sleepyClock is the system clock as Linux has it: while the machine is
// suspended the monotonic clock (CLOCK_MONOTONIC, what Go's time.Since
// reads) stops, and the boot's uptime (CLOCK_BOOTTIME) and
// the wall clock go on.
type sleepyClock struct {
	*outbox.AdjustableClock
	mu    sync.Mutex
	slept time.Duration
}

func newSleepyClock() *sleepyClock { return &sleepyClock{AdjustableClock: outbox.NewAdjustableClock()} }

func (c *sleepyClock) Boot() (string, time.Duration, bool) {
	id, up, ok := c.AdjustableClock.Boot()
	c.mu.Lock()
	defer c.mu.Unlock()
	return id, up + c.slept, ok
}

// Suspend: the machine sleeps for d with the node running.
func (c *sleepyClock) Suspend(d time.Duration) {
	c.Step(d)
	c.mu.Lock()
	c.slept += d
	c.mu.Unlock()
}

// A receiver whose machine slept two days earlier in its run (a laptop
// overnight twice, a paused VM) records an idempotency key, then restarts
// (an upgrade, a second). Had the restart counted the two days of sleep of
// the previous run as downtime, the key recorded seconds ago would be older
// than KeyWindow, and the application's retry under it would run a second
// time. A checkpoint reads the boot's uptime then, sleep included.
func TestSuspendBeforeReceiverRestartKeepsIdempotencyKeys(t *testing.T) {
	dir := t.TempDir()
	clk2 := newSleepyClock()
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
	send("warmup")
	s.waitLen(t, 1)

	clk2.Suspend(48 * time.Hour) // the receiver's machine slept; the node ran on after
	send("charge order-42", node.WithIdempotencyKey("order-42"))
	s.waitLen(t, 2)

	if err := n2.Close(); err != nil { // restarted within the same boot, moments later
		t.Fatal(err)
	}
	n2 = newNode(t, "n2", filepath.Join(dir, "n2"), edit2, n1.GossipAddr())
	if _, err := n2.Spawn("pay", s.handler); err != nil {
		t.Fatal(err)
	}
	waitAlive(t, []*node.Node{n1, n2}, 2)

	send("charge order-42", node.WithIdempotencyKey("order-42"))
	send("sentinel")
	s.waitLen(t, 3)
	testutil.WaitFor(t, 15*time.Second, "sentinel", func() bool {
		v := s.values()
		return v[len(v)-1] == "sentinel"
	})
	got := s.values()
	if n := strings.Count(strings.Join(got, "|"), "charge order-42"); n != 1 {
		t.Fatalf("handler ran %v: key order-42 ran %d times, seconds apart (the restart counted the machine's earlier sleep as downtime)", got, n)
	}
}

// A sender whose machine slept two days earlier in its run queues a
// message with a 1 h TTL for a peer that is offline, and restarts moments
// later: had the restart counted the sleep as downtime, it would
// dead-letter the message, though its peer joins seconds after it was
// queued.
func TestSuspendBeforeSenderRestartExpiresNoHealthyMessage(t *testing.T) {
	dir := t.TempDir()
	clk1 := newSleepyClock()
	edit1 := func(c *node.Config) { fastRetries(c); c.Outbox.Clock = clk1 }
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), edit1)
	clk1.Suspend(48 * time.Hour)
	if out, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String("a"), node.WithTTL(time.Hour)); err != nil || out != node.Queued {
		t.Fatalf("TellReliable = %v, %v", out, err)
	}
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
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
		t.Fatalf("dead-lettered the message (reason %q) seconds after it was queued with a 1 h TTL: the restart counted the machine's earlier sleep as downtime", dl[0].Reason)
	}
}

package node_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
)

// The restored sender's burst starts at the receiver's watermark: x y z
// under 3 4 5, where c ran at 3. The sink (busy, mailbox of two,
// DropOldest) queues x and y, and z evicts x. The drop hook compares x
// with c's digest once it gets there (refuseForRoom, after the mailbox
// let go of x), held here until z ran and a commit ended after it (at
// most dropGateBound). Were the actor, freed meanwhile, to take y then,
// it would find it in order (prev 3 = w) and run it, then z: the
// watermark would be 5 when the hook looks, x no longer at it, and the
// hook would answer a plain refusal with z's watermark. No receipt of the
// emission would show another message at a watermark; y and z would be
// acked, and x, sent again below the watermark, answered DUPLICATE:
// never run. x must run, and before y.
func TestDroppedMessageAtTheWatermarkIsNotLostWhileItsSuccessorsRun(t *testing.T) {
	s := newHoldSink("hold")
	handler, zRan := signalRun(s, "z")
	burst := []string{"x", "y", "z"}
	n1, d2 := restoredAtTheWatermark(t, s, handler, burst)

	// The hook goes on once z ran (its handler, still running then, has
	// not yet moved the watermark) and a commit ended after it: y's
	// watermark is durable by then.
	hookGo := make(chan struct{})
	var n2 *node.Node // read by the waiter only once z ran, after it is set
	var release func()
	gate := &dropGate{dropped: make(chan struct{}), wait: hookGo}
	waiterDone := make(chan struct{})
	go func() {
		defer close(waiterDone)
		defer close(hookGo)
		select {
		case <-zRan:
		case <-time.After(dropGateBound): // z cannot run while the hook is held
			return
		}
		base := n2.Outbox().Stats().Fsyncs
		testutil.Poll(5*time.Second, func() bool { return n2.Outbox().Stats().Fsyncs > base })
	}()
	t.Cleanup(func() { <-waiterDone })
	n2, release = busyDropOldestReceiver(t, n1, d2, s, handler, slog.New(gate))
	select {
	case <-gate.dropped:
	case <-time.After(15 * time.Second):
		t.Fatal("no message dropped")
	}
	release()
	checkBurstRan(t, n1, n2, s, burst)
}

package testnet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
)

// A message that TellReliable accepts (it fits the frame limit with the
// room CheckSize keeps for per-emission fields) but that no longer fits
// once it carries its origin (certificate, outbox id, signature) cannot be
// forwarded. While A↔C is cut and B can forward, held back for the
// direct path, it would hold every later message of its stream behind
// it for as long as the partial partition lasts, though a forwarder is
// there. A message queued after it must be delivered while the cut
// lasts.
func TestMessageTooLargeToForwardDoesNotHoldItsStream(t *testing.T) {
	const frame = 8192
	rec := NewRecorder(44)
	const a, b, cc = 0, 1, 2
	c := New(t, 3, sinks(rec, NoBug), fastForward(), WithConfig(func(_ int, cfg *node.Config) {
		cfg.Transport.MaxFrameSize = frame
	}))
	c.Cut(a, cc)
	testutil.WaitFor(t, 30*time.Second, "A's streams to C go through B", func() bool {
		sendN(t, c, rec, a, cc, 1)
		return c.Node(a).Routes()[c.Name(cc)].Via == c.Name(b)
	})
	if err := c.WaitDrained(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The largest message TellReliable accepts.
	accepted := false
	for pad := frame; pad > frame-2048 && !accepted; pad -= 8 {
		out, err := SendReliable(context.Background(), rec, c.Node(a), c.Addr("sink", cc), Msg{Extra: []byte(strings.Repeat("x", pad))})
		switch {
		case errors.Is(err, node.ErrTooLarge):
		case err != nil:
			t.Fatalf("send with %d bytes of padding: %v", pad, err)
		default:
			t.Logf("accepted with %d bytes of padding: %v", pad, out)
			accepted = true
		}
	}
	if !accepted {
		t.Fatal("no padding accepted")
	}
	sendN(t, c, rec, a, cc, 5) // small, healthy, Queued behind it
	if !c.Sees(a, cc) {
		t.Fatal("A lost C from membership: this is not a partial partition")
	}
	if err := c.WaitDrained(20 * time.Second); err != nil {
		// B's side says why it did not carry them (its refusals are the
		// unsigned receipts A counts).
		t.Fatalf("with a forwarder available, A's queued messages to C were not delivered: %v (A forward stats %+v, routes %+v; B forward stats %+v, B sees C %v; C forward stats %+v)",
			err, c.Node(a).Stats().Forward, c.Node(a).Routes(), c.Node(b).Stats().Forward, c.Sees(b, cc), c.Node(cc).Stats().Forward)
	}
}

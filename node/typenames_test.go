package node_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// payloadChecker spawns c on n, which counts the messages it runs (got),
// those whose body is not payload128 with its type (wrong), and answers
// payload128.
func payloadChecker(t *testing.T, n *node.Node) (to node.Address, got, wrong *atomic.Int64) {
	t.Helper()
	want, err := anypb.New(payload128)
	if err != nil {
		t.Fatal(err)
	}
	got, wrong = new(atomic.Int64), new(atomic.Int64)
	to, err = n.Spawn("c", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.BytesValue
		if m.Envelope().GetBody().GetTypeUrl() != want.GetTypeUrl() || m.Decode(&v) != nil || len(v.GetValue()) != 128 {
			wrong.Add(1)
		}
		got.Add(1)
		return payload128, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return to, got, wrong
}

// A remote tell names its body's type once on its lane stream: every
// handler still sees the type and the message, and a 128-byte tell takes
// under 200 bytes on the wire (242 with the type URL in each).
func TestRemoteTellsNameTheirBodyTypeOnce(t *testing.T) {
	nodes := cluster(t, 2)
	to, got, wrong := payloadChecker(t, nodes[1])
	const k = 500
	before := nodes[0].PeerStats()["n2"]
	for range k {
		if err := nodes[0].Tell(context.Background(), to, payload128); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "tells handled", func() bool { return got.Load() == k })
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d of %d handlers saw another type or message", n, k)
	}
	testutil.WaitFor(t, 5*time.Second, "n1's counters", func() bool { return nodes[0].PeerStats()["n2"].FramesOut >= before.FramesOut+k })
	after := nodes[0].PeerStats()["n2"]
	if per := float64(after.BytesOut-before.BytesOut) / float64(after.FramesOut-before.FramesOut); per > 200 {
		t.Fatalf("%.1f bytes per frame on the wire, want under 200", per)
	}
}

// Asks, their replies and reliable sends (those delivered at once and
// those the outbox drains) name their body types on their lane streams
// too: handlers and askers see every type and message, and each frame
// is smaller on the wire than with the type URL in it.
func TestAsksAndReliableSendsNameTheirBodyTypes(t *testing.T) {
	nodes := cluster(t, 2)
	to, got, wrong := payloadChecker(t, nodes[1])
	const k = 300
	ctx := context.Background()
	before, beforeIn := nodes[0].PeerStats()["n2"], nodes[1].PeerStats()["n1"]
	for range k {
		var resp wrapperspb.BytesValue
		if err := nodes[0].Ask(ctx, to, payload128, &resp); err != nil {
			t.Fatal(err)
		}
		if len(resp.GetValue()) != 128 {
			t.Fatalf("reply of %d bytes, want 128", len(resp.GetValue()))
		}
		if _, err := nodes[0].TellReliable(ctx, to, payload128); err != nil {
			t.Fatal(err)
		}
	}
	targets := make([]node.Address, k)
	for i := range targets {
		targets[i] = to
	}
	if res, err := nodes[0].Dispatch(ctx, targets, payload128); err != nil || res.Accepted != k {
		t.Fatalf("dispatch: %+v, %v", res, err)
	}
	testutil.WaitFor(t, 20*time.Second, "every message handled", func() bool { return got.Load() == 3*k })
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d of %d handlers saw another type or message", n, 3*k)
	}
	testutil.WaitFor(t, 5*time.Second, "the counters", func() bool {
		return nodes[0].PeerStats()["n2"].FramesOut >= before.FramesOut+3*k && nodes[1].PeerStats()["n1"].FramesOut >= beforeIn.FramesOut+k
	})
	// n1 sends asks, reliable envelopes and their runs: 206 bytes a frame
	// with types and routes named (a reliable envelope's sequence and the
	// one before it are microseconds of the wall clock, 8 bytes each; 200
	// when they were small counts), about 9 more with types alone and 55
	// more with the type URL, the sender and the recipient in each. (n2's
	// frames mix replies with receipts, whose count varies with how they
	// are grouped.)
	out := nodes[0].PeerStats()["n2"]
	per := float64(out.BytesOut-before.BytesOut) / float64(out.FramesOut-before.FramesOut)
	if per > 211 {
		t.Fatalf("%.1f bytes per frame n1 → n2, want under 211", per)
	}
	t.Logf("%.1f bytes per frame n1 → n2", per)
}

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

// A remote tell names its body's type once on its lane stream: every
// handler still sees the type and the message, and a 128-byte tell takes
// under 200 bytes on the wire (242 with the type URL in each).
func TestRemoteTellsNameTheirBodyTypeOnce(t *testing.T) {
	nodes := cluster(t, 2)
	want, err := anypb.New(payload128)
	if err != nil {
		t.Fatal(err)
	}
	var got, wrong atomic.Int64
	to, err := nodes[1].Spawn("c", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.BytesValue
		if m.Envelope().GetBody().GetTypeUrl() != want.GetTypeUrl() || m.Decode(&v) != nil || len(v.GetValue()) != 128 {
			wrong.Add(1)
		}
		got.Add(1)
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
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

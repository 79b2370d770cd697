package transport_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Batches of envelopes whose frames sweep the large threshold a byte at a
// time (named types and routes change each frame's size against its
// envelope's), some batches starting and some ending with a large frame,
// their spans crossing the 64 KiB chunk boundaries at every offset: each
// arrives whole, in order, and the gate ends with every slot free.
func TestBatchesSweepingTheLargeThresholdArriveWhole(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	var mu sync.Mutex
	var got []*pb.Envelope
	h := handlerFunc(func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		mu.Lock()
		got = append(got, env)
		mu.Unlock()
		if reply != nil {
			reply(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_ACCEPTED})
		}
	})
	scfg := testConfig(t, ca, "srv")
	scfg.MaxReadBytes = scfg.MaxFrameSize // one slot
	startNode(t, scfg, r, h)
	good := startNode(t, testConfig(t, ca, "good"), r, &recorder{})
	const to = "sweep@srv"
	var want []*pb.Envelope
	k := 0
	mk := func(n int) *pb.Envelope {
		env := envTo(t, to, pb.Envelope_RECEIPT_ACCEPTED)
		v := bytes.Repeat([]byte{byte(k)}, n)
		b, err := anypb.New(wrapperspb.Bytes(v))
		if err != nil {
			t.Fatal(err)
		}
		env.Body = b
		env.MsgId = fmt.Sprintf("m%d-%d", k, n)
		k++
		return env
	}
	for round := 0; round < 4; round++ {
		for base := 16<<10 - 400; base < 16<<10+40; base += 7 {
			var batch []*pb.Envelope
			if round%2 == 0 {
				batch = append(batch, mk(base))
			}
			for j := 0; j < 5; j++ {
				batch = append(batch, mk(base+j), mk(10+j*round))
			}
			if round%2 == 1 {
				batch = append(batch, mk(base+1))
			}
			want = append(want, batch...)
			if _, err := good.RequestBatch(ctxT(t, 20*time.Second), "srv", batch); err != nil {
				t.Fatalf("batch at %d: %v", base, err)
			}
		}
	}
	testutil.WaitFor(t, 20*time.Second, "every envelope", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= len(want)
	})
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(want) {
		t.Fatalf("got %d envelopes, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].GetMsgId() != want[i].GetMsgId() || !bytes.Equal(got[i].GetBody().GetValue(), want[i].GetBody().GetValue()) {
			t.Fatalf("envelope %d: got %s (%d bytes), want %s (%d bytes)", i, got[i].GetMsgId(), len(got[i].GetBody().GetValue()), want[i].GetMsgId(), len(want[i].GetBody().GetValue()))
		}
	}
	if _, free, held, waiting := transport.LargeGate(good.Transport, "srv"); free != 1 || held != 0 || waiting != 0 {
		t.Fatalf("gate after: free %d held %d waiting %d, want 1 0 0", free, held, waiting)
	}
}

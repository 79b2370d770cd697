package transport_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// Large frames sent on every lane at once all arrive, on the same
// connection. Reading a frame larger than a stream's buffer takes the
// connection's read budget (two 3 MiB frames here); were the lanes to
// write them at once, every frame would be partly received, the window of
// the connection spent on frames waiting for budget, and the frames
// holding the budget would never complete: the connection would end in
// the frame read timeout with the frames lost.
func TestLargeFramesOnEveryLaneArrive(t *testing.T) {
	const body = 3 << 20
	ca := newCA(t)
	r := newResolver()
	rec := &recorder{}
	cfg := bulkConfig(t, ca, "srv")
	// A stall loses the frames it holds when this runs out, well within
	// the wait below.
	cfg.FrameReadTimeout = 10 * time.Second
	srv := startNode(t, cfg, r, rec)
	good := startNode(t, bulkConfig(t, ca, "good"), r, &recorder{})
	// One recipient on each lane.
	lanes := cfg.Lanes
	recipients := make([]string, lanes)
	for i, found := 0, 0; found < lanes; i++ {
		name := fmt.Sprintf("a%d@srv", i)
		if l := transport.LaneOf(name, lanes); recipients[l] == "" {
			recipients[l] = name
			found++
		}
	}
	payload, err := anypb.New(wrapperspb.Bytes(make([]byte, body)))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, lanes)
	for _, to := range recipients {
		env := envTo(t, to, pb.Envelope_RECEIPT_NONE)
		env.Body = payload
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := good.Send(ctxT(t, 30*time.Second), "srv", env); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("send: %v", err)
	}
	testutil.WaitFor(t, 60*time.Second, fmt.Sprintf("%d large frames delivered", lanes), func() bool {
		return rec.count.Load() == int64(lanes)
	})
	assertGoodPeerWorks(t, srv, good)
}

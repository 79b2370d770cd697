package transport_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// srv's read budget holds one frame of the largest size. good answers a
// steady stream of srv's requests with receipts whose messages are larger
// than the stream buffer (they take read budget on srv's control stream,
// and no large-frame slot on good), while good sends srv frames near the
// frame limit on a lane: each of them arrives, within srv's frame read
// timeout, and the connection stays.
func TestLargeFramesArriveBesideAStreamOfLargeReceipts(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	var got atomic.Int64
	srvH := handlerFunc(func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) { got.Add(1) })
	scfg := bulkConfig(t, ca, "srv")
	scfg.MaxFrameSize = 1 << 20
	scfg.MaxReadBytes = scfg.MaxFrameSize // one slot
	// Short enough that a frame starved of read budget ends the
	// connection within the test's wait, long enough for a 1 MiB frame
	// under the race detector on a busy machine (3 s was not, once).
	scfg.FrameReadTimeout = 8 * time.Second
	srv := startNode(t, scfg, r, srvH)
	long := strings.Repeat("e", 200<<10)
	goodH := handlerFunc(func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		if reply != nil {
			reply(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_CAPACITY, Message: long})
		}
	})
	gcfg := bulkConfig(t, ca, "good")
	gcfg.MaxFrameSize = 1 << 20
	good := startNode(t, gcfg, r, goodH)
	if err := good.Send(ctxT(t, 5*time.Second), "srv", envTo(t, "warm@srv", pb.Envelope_RECEIPT_NONE)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "warm-up", func() bool { return got.Load() == 1 })
	id := transport.ConnID(good.Transport, "srv")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, stop := context.WithTimeout(ctx, 5*time.Second)
				if _, err := srv.Request(c, "good", envTo(t, "asker@good", pb.Envelope_RECEIPT_ACCEPTED)); err == nil {
					answered.Add(1)
				}
				stop()
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	testutil.WaitFor(t, 10*time.Second, "receipts flowing", func() bool { return answered.Load() > 100 })
	payload := largeBody(t, 1<<20-200)
	const n = 8
	for i := 0; i < n; i++ {
		env := envTo(t, "big@srv", pb.Envelope_RECEIPT_NONE)
		env.Body = payload
		if err := good.Send(ctxT(t, 10*time.Second), "srv", env); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 20*time.Second, "every large frame", func() bool {
		if got.Load() == n+1 {
			return true
		}
		if now := transport.ConnID(good.Transport, "srv"); now != id {
			t.Fatalf("connection replaced after %d of %d large frames (%d receipts answered); srv logs:\n%s", got.Load()-1, n, answered.Load(), lastLines(srv.logs.String(), 15))
		}
		return false
	})
	t.Logf("receipts answered: %d", answered.Load())
}

func lastLines(s string, n int) string {
	l := strings.Split(s, "\n")
	var keep []string
	for _, x := range l {
		if !strings.Contains(x, "level=DEBUG") {
			keep = append(keep, x)
		}
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	return strings.Join(keep, "\n")
}

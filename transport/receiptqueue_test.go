package transport_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/rawpeer"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// burstReplier answers envelopes in bursts, all from one goroutine in a
// loop, as a receiver's group commit answers the messages it made durable
// together: n at once, and every millisecond whatever is held.
type burstReplier struct {
	n    int
	mu   sync.Mutex
	held []func()
	wg   sync.WaitGroup
}

func newBurstReplier(t *testing.T, n int) *burstReplier {
	b := &burstReplier{n: n}
	stop := make(chan struct{})
	b.wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				b.mu.Lock()
				burst := b.held
				b.held = nil
				b.mu.Unlock()
				for _, f := range burst {
					f()
				}
			}
		}
	})
	t.Cleanup(func() { close(stop); b.wg.Wait() })
	return b
}

func (b *burstReplier) HandleEnvelope(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	if reply == nil {
		return
	}
	id := env.GetMsgId()
	b.mu.Lock()
	b.held = append(b.held, func() { reply(&pb.Receipt{MsgId: id, Code: pb.Receipt_PROCESSED}) })
	var burst []func()
	if len(b.held) >= b.n {
		burst, b.held = b.held, nil
	}
	b.mu.Unlock()
	if burst != nil {
		b.wg.Go(func() {
			for _, f := range burst {
				f()
			}
		})
	}
}

// TestReceiptsOutnumberingTheSendQueueAreKept: two transports with a send
// queue of 16. a keeps eight RequestBatch calls of 4 envelopes in flight;
// b answers them 32 at a time from one goroutine. b's control lane then
// holds more receipts than SendQueueSize for its writer, though each
// answers an envelope a sent within its own bound. Every receipt must
// arrive: a dropped one left its request waiting for its deadline on a
// healthy connection (and a relay's emission holding the peer's slots
// until DeliverTimeout).
func TestReceiptsOutnumberingTheSendQueueAreKept(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	cb := testConfig(t, ca, "b")
	cb.SendQueueSize = 16
	b := startNode(t, cb, r, newBurstReplier(t, 32))
	cfgA := testConfig(t, ca, "a")
	cfgA.SendQueueSize = 16
	a := startNode(t, cfgA, r, &recorder{})

	var lost, done atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	var rounds atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for rounds.Add(1) <= 400 && lost.Load() == 0 {
				envs := make([]*pb.Envelope, 4)
				for i := range envs {
					envs[i] = envTo(t, fmt.Sprintf("r%d@b", g), pb.Envelope_RECEIPT_PROCESSED)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				rcs, err := a.RequestBatch(ctx, "b", envs)
				cancel()
				switch {
				case errors.Is(err, transport.ErrQueueFull):
					continue // a's own queue: try again
				case errors.Is(err, context.DeadlineExceeded):
					lost.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					return
				case err != nil:
					t.Errorf("RequestBatch: %v", err)
					return
				}
				for i, rc := range rcs {
					if rc.GetMsgId() != envs[i].GetMsgId() {
						t.Errorf("receipt %d is %v, want %s's", i, rc, envs[i].GetMsgId())
					}
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	drops := strings.Count(b.logs.String(), "receipt dropped")
	t.Logf("%d batches answered; %d waited for their deadline; b dropped %d receipts", done.Load(), lost.Load(), drops)
	if lost.Load() > 0 || drops > 0 {
		t.Fatalf("a healthy peer within its bounds dropped %d receipts; a request waited for its deadline: %v", drops, firstErr.Load())
	}
}

// TestReceiptRefusalIsRaceFree: with room for a single receipt, bursts of
// answers are refused (and the connection closed) while the control
// lane's writer empties the queue; under -race, nothing of the refusal
// may read the lane's state outside its lock.
func TestReceiptRefusalIsRaceFree(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	cb := testConfig(t, ca, "b")
	transport.SetMaxQueuedReceipts(&cb, 1)
	startNode(t, cb, r, newBurstReplier(t, 64))
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	var wg sync.WaitGroup
	for round := range 20 {
		for g := range 8 {
			wg.Go(func() {
				envs := make([]*pb.Envelope, 8)
				for i := range envs {
					envs[i] = envTo(t, fmt.Sprintf("r%d-%d@b", round, g), pb.Envelope_RECEIPT_PROCESSED)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				defer cancel()
				_, _ = a.RequestBatch(ctx, "b", envs) // refusals close the connection; only the race matters here
			})
		}
		wg.Wait()
	}
}

// TestPeerThatReadsNoReceiptsIsDisconnected: a member sends envelopes
// asking for receipts and never reads its control stream. Once flow
// control stops the receipts' writer, they pile up to the bound and the
// connection is closed, instead of the queue growing for ever; another
// peer is not affected.
func TestPeerThatReadsNoReceiptsIsDisconnected(t *testing.T) {
	ca, srv, good, _ := hostileSetup(t, func(c *transport.Config) { transport.SetMaxQueuedReceipts(c, 64) })
	evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
	s := evil.Lane(t)
	// Writes end with an error once the server closes the connection.
	sent := 0
	for ; sent < 200_000; sent++ {
		if err := evil.TrySend(s, envTo(t, "x@srv", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
			break
		}
		if sent%1000 == 0 && evil.Conn.Context().Err() != nil {
			break
		}
	}
	t.Logf("sent %d envelopes", sent)
	assertClosedWith(t, evil, transport.CodeProtocol, 10*time.Second)
	assertGoodPeerWorks(t, srv, good)
}

// TestReceiptQueueBoundedInBytes: a member sends envelopes asking for
// receipts and never reads its control stream. The receiver's handler
// answers each with a receipt that repeats the recipient (as a node's
// NO_SUCH_ACTOR receipt does: "no actor "+recipient), 15 KB each. The
// receipts waiting for a writer that flow control stopped must stay within
// SendQueueBytes (here 8 MiB), not grow to their count bound times their
// size: the connection is closed long before the heap grows by 64 MiB.
func TestReceiptQueueBoundedInBytes(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	cfg := testConfig(t, ca, "srv")
	cfg.MaxFrameSize = 1 << 20
	cfg.SendQueueBytes = 8 << 20
	cfg.SendQueueSize = 256
	srv := startNode(t, cfg, r, handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		if reply != nil {
			reply(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_NO_SUCH_ACTOR, Message: "no actor " + env.GetRecipient()})
		}
	}))
	evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
	s := evil.Lane(t)
	recipient := strings.Repeat("r", 15000) + "@srv"
	base := heapInUse()
	const limit = 64 << 20
	// 160 MiB of envelopes at most (or 12 s): more than enough to hold
	// the bound's worth of receipts several times over.
	deadline := time.Now().Add(12 * time.Second)
	for sent := 1; sent <= 160<<20/15000 && time.Now().Before(deadline); sent++ {
		env := envTo(t, recipient, pb.Envelope_RECEIPT_PROCESSED)
		if err := evil.TrySend(s, env); err != nil {
			break // closed: the bound worked
		}
		if evil.Conn.Context().Err() != nil {
			break
		}
		if sent%1024 == 0 {
			if grown := heapInUse() - base; grown > limit {
				t.Fatalf("after %d envelopes (%d MiB sent) the receiver's heap grew by %d MiB for receipts a peer does not read; connection still open (SendQueueBytes %d MiB, SendQueueSize %d)",
					sent, sent*15000>>20, grown>>20, cfg.SendQueueBytes>>20, cfg.SendQueueSize)
			}
		}
	}
}

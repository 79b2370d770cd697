package transport_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// A forwarder carries what a member hands it with that member's origin
// (the node checks only that origin.node is the member): a hostile or
// buggy member can hand it an envelope whose origin has a node and an
// outbox id but no certificate. The recipient refuses such an envelope
// (VerifyOrigin); the forwarder's transport sends it in full, without
// naming an origin the recipient would refuse as a name, so its
// connection to the recipient, and every other member's messages on it,
// stay.
func TestOriginWithoutCertificateKeepsTheConnection(t *testing.T) {
	for _, tc := range []struct {
		name   string
		origin *pb.Origin
	}{
		{"node and outbox id", &pb.Origin{Node: "evil", OutboxId: bytes.Repeat([]byte{7}, 16), Signature: []byte("sig")}},
		{"node only", &pb.Origin{Node: "evil", Signature: []byte("sig")}},
		{"outbox id only", &pb.Origin{OutboxId: bytes.Repeat([]byte{7}, 16)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, rec := featuresPair(t, nil)
			good := forwardedEnvelopes(3, 300)
			bad := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "bad", Sender: "@evil", Recipient: "sink@b", Sequence: 9,
				Body: &anypb.Any{TypeUrl: typeURL(0), Value: []byte("x")}, Origin: tc.origin}
			after := forwardedEnvelopes(3, 300)
			for i, e := range after {
				e.MsgId = fmt.Sprint("after-", i)
			}
			sent := append(append(append([]*pb.Envelope{}, good...), bad), after...)
			ctx := ctxT(t, 10*time.Second)
			for _, env := range sent {
				if err := a.Send(ctx, "b", env); err != nil {
					t.Fatalf("send %s: %v", env.GetMsgId(), err)
				}
			}
			waitCond(t, 10*time.Second, "every envelope at b, or b closing the connection", func() bool {
				return rec.count.Load() >= int64(len(sent)) || strings.Contains(b.logs.String(), "bad input")
			})
			noBadInput(t, b)
			checkArrivedAsSent(t, a, b, rec, 0, sent)
			if ok, _ := transport.ConnInfo(b.Transport, "a"); !ok {
				t.Fatal("b lost its connection to a")
			}
		})
	}
}

// Batches of forwarded envelopes of 24 origins (past the 16 a stream
// names), some certificates near the bytes bound, mixed with plain
// envelopes, from 8 senders against a small queue (runs refused and
// their names taken back) and while the connection is closed again and
// again: every envelope that arrives arrives as sent, once, in each
// sender's order, and no connection closes for bad input.
func TestOriginBatchesOnSmallQueues(t *testing.T) { originBatches(t, false) }

// The same while the connection is closed again and again (no order
// across connections).
func TestOriginBatchesWhileConnectionsAreReplaced(t *testing.T) { originBatches(t, true) }

func originBatches(t *testing.T, churn bool) {
	ca, r := newCA(t), newResolver()
	cfg := testConfig(t, ca, "a")
	cfg.SendQueueSize = 16
	cfg.MaxFrameSize, cfg.SendQueueBytes = 32<<10, 48<<10
	cfg.Lanes = 2
	a := startNode(t, cfg, r, &recorder{})
	check := newAsSent(churn)
	b := startNode(t, testConfig(t, ca, "b"), r, handlerFunc(check.handle))
	ctx := ctxT(t, 90*time.Second)
	stop := make(chan struct{})
	var churner sync.WaitGroup
	churner.Go(func() {
		for churn {
			select {
			case <-stop:
				return
			case <-time.After(40 * time.Millisecond):
				a.ClosePeer("b", "churn")
			}
		}
	})
	var wg sync.WaitGroup
	var accepted atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i, attempt := 0, 0; i < 120; attempt++ {
				n := 1 + (g+i)%4
				var batch []*pb.Envelope
				for j := range n {
					k := g*131 + (i+j)*17
					env := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("g%d-%d-%d", g, i+j, attempt),
						Sender: fmt.Sprintf("@o%d", k%24), Recipient: fmt.Sprintf("sink%d@b", g),
						Sequence: uint64(i + j + 1), Receipt: pb.Envelope_RECEIPT_PROCESSED,
						Body: &anypb.Any{TypeUrl: typeURL(k % 5), Value: []byte(fmt.Sprint(k))}}
					if k%5 != 0 {
						o := k % 24
						cert := 300 + o*20
						if o%8 == 0 {
							cert = 7000 + o // near the bytes bound: a stream names one or two
						}
						env.Origin = &pb.Origin{Node: fmt.Sprintf("o%d", o), OutboxId: bytes.Repeat([]byte{byte(o + 1)}, 16),
							Certificate: bytes.Repeat([]byte{byte('A' + o)}, cert), Signature: []byte(fmt.Sprint("sig-", k))}
					}
					batch = append(batch, env)
				}
				for _, env := range batch {
					check.expect(env.GetMsgId(), proto.CloneOf(env))
				}
				if _, err := a.RequestBatch(ctx, "b", batch); err != nil {
					if ctx.Err() != nil {
						return
					}
					continue // refused or lost: again, under new ids
				}
				accepted.Add(int64(n))
				i += n
			}
		})
	}
	wg.Wait()
	close(stop)
	churner.Wait()
	if !churn {
		waitCond(t, 20*time.Second, "every accepted envelope at b", func() bool { return check.got.Load() >= accepted.Load() })
	}
	check.fail(t)
	noBadInput(t, a, b)
	t.Logf("%d accepted, %d arrivals", accepted.Load(), check.got.Load())
}

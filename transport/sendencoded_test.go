package transport_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// Envelopes sent already encoded arrive as those sent with Send, in the
// order of the two kinds of send on the lane they share.
func TestSendEncodedArrivesAsSent(t *testing.T) {
	ca, r := newCA(t), newResolver()
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	rec := &recorder{}
	startNode(t, testConfig(t, ca, "b"), r, rec)
	ctx := ctxT(t, 10*time.Second)

	var sent []*pb.Envelope
	for i := range 40 {
		env := envTo(t, "sink@b", pb.Envelope_RECEIPT_NONE)
		env.TtlMs = int64(i)
		sent = append(sent, env)
		if i%2 == 0 {
			if err := a.Send(ctx, "b", env); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := proto.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.SendEncoded(ctx, "b", env.Recipient, b, transport.Body{}); err != nil {
			t.Fatal(err)
		}
		clear(b) // the caller's to reuse once SendEncoded returns
	}
	waitCond(t, 10*time.Second, "every envelope at b", func() bool { return rec.count.Load() == int64(len(sent)) })
	got, from := rec.snapshot()
	for i, env := range got {
		if !proto.Equal(env, sent[i]) {
			t.Fatalf("envelope %d arrived as %v, sent %v", i, env, sent[i])
		}
		if from[i].Name != "a" {
			t.Fatalf("envelope %d arrived from %q, want a", i, from[i].Name)
		}
	}
}

// SendEncoded refuses what Send refuses: a frame over the limit, and a
// full queue, which says when to come back; room it did not use is given
// back, so the queue drains to a send that fits.
func TestSendEncodedRefusals(t *testing.T) {
	p := stalledPair(t, nil)
	a := p.a
	ctx := ctxT(t, 20*time.Second)
	huge, err := proto.Marshal(bigEnv(t, 300<<10))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SendEncoded(ctx, "b", "slow@b", huge, transport.Body{}); !errors.Is(err, transport.ErrFrameTooLarge) {
		t.Fatalf("SendEncoded of 300 KiB over a 256 KiB frame limit = %v, want ErrFrameTooLarge", err)
	}

	big := bigEnv(t, 200<<10)
	fillQueue(t, a, big)
	enc, err := proto.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	var qf *transport.QueueFullError
	if err := a.SendEncoded(ctx, "b", "slow@b", enc, transport.Body{}); !errors.As(err, &qf) || qf.RetryAfter <= 0 {
		t.Fatalf("SendEncoded to a full queue = %v, want a *QueueFullError with a retry hint", err)
	}
	p.release()
	waitCond(t, 15*time.Second, "the queue draining to an encoded send", func() bool {
		err := a.SendEncoded(ctx, "b", "slow@b", enc, transport.Body{})
		if err != nil && !errors.Is(err, transport.ErrQueueFull) {
			t.Fatalf("SendEncoded while the queue drains: %v", err)
		}
		return err == nil
	})
	waitCond(t, 15*time.Second, "the queue empty, every refusal's room given back", func() bool {
		frames, bytes := transport.Queued(a.Transport, "b")
		return frames == 0 && bytes == 0
	})
}

// Sends of every kind (Send, SendEncoded, RequestBatch) racing on one
// small send queue, many refused as full: every frame queued is written
// and every refusal gives its room back, so the queue drains to zero, and
// every batch that was accepted gets all its receipts.
func TestEveryKindOfSendSharesTheQueueBoundWithoutLeaking(t *testing.T) {
	ca, r := newCA(t), newResolver()
	cfg := testConfig(t, ca, "a")
	cfg.SendQueueSize = 16
	a := startNode(t, cfg, r, &recorder{})
	rec := &recorder{}
	startNode(t, testConfig(t, ca, "b"), r, rec)
	ctx := ctxT(t, 30*time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fails []string
	fail := func(f string, args ...any) {
		mu.Lock()
		fails = append(fails, fmt.Sprintf(f, args...))
		mu.Unlock()
	}
	for g := range 12 {
		wg.Go(func() {
			for i := range 200 {
				rcpt := fmt.Sprintf("r%d@b", (g+i)%5)
				switch g % 3 {
				case 0:
					err := a.Send(ctx, "b", envTo(t, rcpt, pb.Envelope_RECEIPT_NONE))
					if err != nil && !errors.Is(err, transport.ErrQueueFull) {
						fail("send: %v", err)
					}
				case 1:
					b, _ := proto.Marshal(envTo(t, rcpt, pb.Envelope_RECEIPT_NONE))
					err := a.SendEncoded(ctx, "b", rcpt, b, transport.Body{})
					if err != nil && !errors.Is(err, transport.ErrQueueFull) {
						fail("send encoded: %v", err)
					}
				case 2:
					envs := []*pb.Envelope{envTo(t, rcpt, pb.Envelope_RECEIPT_PROCESSED), envTo(t, rcpt, pb.Envelope_RECEIPT_PROCESSED), envTo(t, rcpt, pb.Envelope_RECEIPT_PROCESSED)}
					rcs, err := a.RequestBatch(ctx, "b", envs)
					if err != nil {
						if !errors.Is(err, transport.ErrQueueFull) {
							fail("batch: %v", err)
						}
						continue
					}
					for j, rc := range rcs {
						if rc.GetCode() != pb.Receipt_PROCESSED {
							fail("batch receipt %d: %v", j, rc)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	for _, f := range fails {
		t.Error(f)
	}
	waitCond(t, 15*time.Second, "the queue empty", func() bool {
		frames, bytes := transport.Queued(a.Transport, "b")
		return frames == 0 && bytes == 0
	})
}

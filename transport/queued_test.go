package transport_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/queued"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// A batch's caller learns, through its context, when the batch is queued
// on its lane, before any receipt: the relay sends a stream's next batch
// only then, and the peer takes the two in the order they were queued.
func TestRequestBatchSaysWhenQueued(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	var mu sync.Mutex
	var got []string
	var replies []func(*pb.Receipt)
	startNode(t, testConfig(t, ca, "b"), r, handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, env.GetMsgId())
		replies = append(replies, reply) // answered once both batches arrived
	}))
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})

	batch := func(n int) []*pb.Envelope {
		envs := make([]*pb.Envelope, n)
		for i := range envs {
			envs[i] = envTo(t, "sink@b", pb.Envelope_RECEIPT_PROCESSED)
		}
		return envs
	}
	first, second := batch(300), batch(5)
	queuedFirst := make(chan struct{})
	results := make(chan error, 2)
	send := func(ctx context.Context, envs []*pb.Envelope) {
		_, err := a.RequestBatch(ctx, "b", envs)
		results <- err
	}
	var calls int
	go send(queued.With(ctxT(t, 10*time.Second), func() { calls++; close(queuedFirst) }), first)
	select {
	case <-queuedFirst:
	case err := <-results:
		t.Fatalf("the first batch returned (%v) without saying it was queued", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the first batch never said it was queued")
	}
	go send(ctxT(t, 10*time.Second), second)
	testutil.WaitFor(t, 10*time.Second, "both batches received", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == len(first)+len(second)
	})
	mu.Lock()
	for _, reply := range replies {
		reply(&pb.Receipt{Code: pb.Receipt_PROCESSED})
	}
	want := append(first, second...)
	for i, id := range got {
		if id != want[i].GetMsgId() {
			t.Errorf("envelope %d received is %s, want %s: the second batch overtook the first", i, id, want[i].GetMsgId())
			break
		}
	}
	mu.Unlock()
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Fatalf("said queued %d times, want once", calls)
	}
}

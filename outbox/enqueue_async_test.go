package outbox_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// EnqueueAsync acknowledges nothing before its commit, calls back in the
// order of the calls, and what it acknowledged is in the file.
func TestEnqueueAsync(t *testing.T) {
	e := open(t, nil)
	e.msg(t, "a@n1", "") // reserves a block of sequences: the stalled committer could not
	release := stall(t, e.Store)
	var mu sync.Mutex
	var order []string
	done := make(chan struct{})
	typs := names("m", 50)
	for _, typ := range typs {
		err := e.EnqueueAsync(context.Background(), e.msg(t, "a@n1", typ), func(res outbox.Result, err error) {
			if err != nil || res != outbox.Queued {
				t.Errorf("%s: %v, %v", typ, res, err)
			}
			mu.Lock()
			order = append(order, typ)
			if len(order) == len(typs) {
				close(done)
			}
			mu.Unlock()
		})
		if err != nil {
			t.Fatalf("EnqueueAsync(%s) = %v", typ, err)
		}
	}
	mu.Lock()
	early := len(order)
	mu.Unlock()
	if early != 0 {
		t.Fatalf("%d callbacks ran while the committer was stalled", early)
	}
	release()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("callbacks did not run")
	}
	if !slices.Equal(order, typs) {
		t.Fatalf("callbacks ran in order %v", order)
	}
	e.reopen(t, nil)
	if got := e.types(t, "a@n1"); !slices.Equal(got, typs) {
		t.Fatalf("stored %v, want %v", got, typs)
	}
}

// What can be refused before the hand-off is returned, and the callback
// never runs.
func TestEnqueueAsyncRefusals(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.QueueSize = 1 })
	never := func(outbox.Result, error) { t.Error("callback of a refused message ran") }
	if err := e.EnqueueAsync(context.Background(), &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1"}}, never); !errors.Is(err, outbox.ErrBadMessage) {
		t.Fatalf("no sequence: %v, want ErrBadMessage", err)
	}
	e.msg(t, "a@n1", "") // reserves a block of sequences: the stalled committer could not
	release := stall(t, e.Store)
	ok := make(chan error, 1)
	if err := e.EnqueueAsync(context.Background(), e.msg(t, "a@n1", "fills the queue"), func(_ outbox.Result, err error) { ok <- err }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.EnqueueAsync(ctx, e.msg(t, "a@n1", "no room"), never); !errors.Is(err, context.Canceled) {
		t.Fatalf("queue full, context done: %v, want context.Canceled", err)
	}
	release()
	if err := <-ok; err != nil {
		t.Fatal(err)
	}
	// A refusal found in the commit (the sequence is taken) comes through
	// the callback; the transaction still commits for the others.
	taken := e.head(t, "a@n1", 1)[0].GetEnvelope().GetSequence()
	dup := make(chan error, 1)
	if err := e.EnqueueAsync(context.Background(), &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: taken, Type: "dup"}},
		func(_ outbox.Result, err error) { dup <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-dup; !errors.Is(err, outbox.ErrBadMessage) {
		t.Fatalf("sequence taken: callback got %v, want ErrBadMessage", err)
	}
	e.reopen(t, nil)
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"fills the queue"}) {
		t.Fatalf("stored %v", got)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.EnqueueAsync(context.Background(), &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: 99}}, never); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("closed: %v, want ErrClosed", err)
	}
}

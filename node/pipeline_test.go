package node_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A reliable backlog for an actor of the same node drains with the next
// emission sent before the receipts of the one in flight (local delivery
// says when it put an emission in the mailbox): each message runs once,
// in order.
func TestLocalBacklogDrainsPipelinedInOrder(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	const total = 3000
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var got []string
	_, err := n.Spawn("sink", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		once.Do(func() {
			close(entered)
			<-release // the stream stays unsettled: the rest is stored
		})
		var s wrapperspb.StringValue
		if err := m.Decode(&s); err != nil {
			return nil, err
		}
		mu.Lock()
		got = append(got, s.GetValue())
		mu.Unlock()
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	to := node.Addr("sink", "n1")
	first := make(chan error, 1)
	go func() {
		_, err := n.TellReliable(ctxT(t), to, wrapperspb.String("m0000"))
		first <- err
	}()
	<-entered
	for i := 1; i < total; i++ {
		if _, err := n.TellReliable(ctxT(t), to, wrapperspb.String(fmt.Sprintf("m%04d", i))); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "all processed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= total
	})
	mu.Lock()
	defer mu.Unlock()
	for i, s := range got {
		if want := fmt.Sprintf("m%04d", i); s != want || i >= total {
			t.Fatalf("message %d ran is %s, want %s (ran %d in all)", i, s, want, len(got))
		}
	}
	if p := n.RelayPipelined(); p == 0 {
		t.Fatal("no emission was sent before the receipts of the one before it")
	}
}

package partition_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/partition"
)

// A node whose AIMD limit is full is held out of the store's scans as a
// whole while other nodes are delivered to, and comes back when its
// emission ends: its other recipients are then delivered too.
func TestFullNodeExcludedThenIncluded(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) {
		c.Limiter = partition.LimiterConfig{Initial: 1, Min: 1, Max: 1} // one emission fills a node
	})
	hold := make(chan struct{})
	entered := make(chan struct{}, 1)
	rg.fake.set(func(f *fake) {
		f.intercept = func(ctx context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if envs[0].GetRecipient() != "a0@slow" {
				return nil, nil, false
			}
			select {
			case entered <- struct{}{}:
			default:
			}
			select {
			case <-hold:
			case <-ctx.Done():
			}
			return nil, nil, false
		}
	})
	rg.queue(t, "a0@slow", "s0")
	rg.relay.Start()
	<-entered
	for i := 1; i < 5; i++ {
		rg.queue(t, fmt.Sprintf("a%d@slow", i), "s")
	}
	for i := range 20 {
		rg.queue(t, fmt.Sprintf("a%d@fast", i), "f")
	}
	testutil.WaitFor(t, wait, "the fast node drained", func() bool {
		return len(rg.store.Recipients("fast")) == 0
	})
	// The slow node's emission holds its one slot: the scan that found
	// its other recipients excluded the node.
	testutil.WaitFor(t, wait, "the full node excluded", func() bool { return rg.store.ExcludedNodes() == 1 })
	for i := 1; i < 5; i++ {
		if n := rg.fake.ranCount(fmt.Sprintf("a%d@slow", i)); n != 0 {
			t.Fatalf("a%d@slow ran %d while its node was full", i, n)
		}
	}
	close(hold)
	testutil.WaitFor(t, wait, "the slow node drained", func() bool { return rg.store.Stats().Depth == 0 })
	if n := rg.store.ExcludedNodes(); n != 0 {
		t.Fatalf("%d nodes still excluded with nothing in flight", n)
	}
	for i := range 5 {
		if n := rg.fake.ranCount(fmt.Sprintf("a%d@slow", i)); n != 1 {
			t.Fatalf("a%d@slow ran %d times, want 1", i, n)
		}
	}
}

// ExcludeNode holds a node's queues out of DueRecipients, including
// queues stored while it is excluded, and IncludeNode brings them back.
func TestStoreExcludeNode(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.queue(t, "a@n1", "1")
	rg.queue(t, "b@n2", "2")
	rg.store.ExcludeNode("n1")
	rg.store.ExcludeNode("n3") // nothing queued yet
	rg.queue(t, "c@n3", "3")
	now := rg.store.ElapsedMs()
	if due, _ := rg.store.DueRecipients(now, nil, 10); len(due) != 1 || due[0] != "b@n2" {
		t.Fatalf("due with n1 and n3 excluded: %v", due)
	}
	if !rg.store.IncludeNode("n1") || !rg.store.IncludeNode("n3") {
		t.Fatal("IncludeNode of an excluded node reported it was not excluded")
	}
	if rg.store.IncludeNode("n4") || rg.store.IncludeNode("n1") { // never excluded, or no more
		t.Fatal("IncludeNode of a node not excluded reported it was")
	}
	if due, _ := rg.store.DueRecipients(now, nil, 10); len(due) != 3 {
		t.Fatalf("due after IncludeNode: %v", due)
	}
	if n := rg.store.ExcludedNodes(); n != 0 {
		t.Fatalf("ExcludedNodes = %d", n)
	}
}

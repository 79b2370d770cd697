package testnet

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
)

// sinks spawns a recording actor "sink" on every node (again on restart).
func sinks(rec *Recorder, bug Bug) Option {
	return WithSpawn(func(_ int, n *node.Node) error {
		_, err := n.Spawn("sink", RecordingHandler(rec, n, bug))
		return err
	})
}

func TestClusterPartitionQueuesThenDelivers(t *testing.T) {
	rec := NewRecorder(1)
	c := New(t, 3, sinks(rec, NoBug))
	ctx := context.Background()
	to := c.Addr("sink", 1)

	out, err := SendReliable(ctx, rec, c.Node(0), to)
	if err != nil || out != node.Delivered {
		t.Fatalf("healthy send = %v, %v; want Delivered", out, err)
	}

	c.Partition([]int{0}, []int{1, 2})
	testutil.WaitFor(t, 10*time.Second, "n0 sees n1 down", func() bool { return !c.Sees(0, 1) })
	for range 20 {
		out, err := SendReliable(ctx, rec, c.Node(0), to)
		if err != nil || out != node.Queued {
			t.Fatalf("send across a partition = %v, %v; want Queued", out, err)
		}
	}
	c.Heal()
	if err := c.WaitConverged(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDrained(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	rep, err := c.Check(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.Delivered != 1 || rep.Queued != 20 || rep.Processed != 21 {
		t.Fatalf("unexpected counts:\n%s", rep)
	}
}

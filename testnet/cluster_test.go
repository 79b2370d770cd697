package testnet

import (
	"context"
	"errors"
	"strings"
	"syscall"
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
	rep := drainedAndChecked(t, c, rec, 10*time.Second)
	if rep.Delivered != 1 || rep.Queued != 20 || rep.Processed != 21 {
		t.Fatalf("unexpected counts:\n%s", rep)
	}
}

func TestClusterKillRestart(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	rec := NewRecorder(2)
	c := New(t, 3, sinks(rec, NoBug))
	ctx := context.Background()
	if err := c.Kill(2); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(2); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("second Kill = %v, want ErrNotRunning", err)
	}
	if err := c.WaitDown(2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if out, err := SendReliable(ctx, rec, c.Node(0), c.Addr("sink", 2)); err != nil || out != node.Queued {
			t.Fatalf("send to killed node = %v, %v; want Queued", out, err)
		}
	}
	if err := c.Restart(2); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(2); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Restart = %v, want ErrRunning", err)
	}
	if err := c.WaitConverged(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDrained(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if b := c.Boots(2); len(b) != 2 || b[0] == b[1] {
		t.Fatalf("boots of n2 = %v, want two different", b)
	}
	rep, err := c.Check(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	// A graceful stop: the sender's outbox survives its own restart.
	c.Isolate(1)
	testutil.WaitFor(t, 10*time.Second, "n0 sees n1 down", func() bool { return !c.Sees(0, 1) })
	// Not converged, and the error says what the first laggard sees.
	if err := c.WaitConverged(time.Millisecond); !errors.Is(err, ErrNotConverged) ||
		!strings.Contains(err.Error(), "n0 sees n1 ") || !strings.Contains(err.Error(), ", not alive") {
		t.Fatalf("WaitConverged with n1 isolated: %v", err)
	}
	for range 5 {
		if _, err := SendReliable(ctx, rec, c.Node(0), c.Addr("sink", 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Stop(0); err != nil {
		t.Fatal(err)
	}
	c.Heal()
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDrained(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if rep, _ = c.Check(rec); rep.Err() != nil || rep.Processed != 15 {
		t.Fatalf("after sender restart: %v\n%s", rep.Err(), rep)
	}
}

func TestClusterBadIndex(t *testing.T) {
	c := New(t, 1)
	for name, err := range map[string]error{
		"kill":    c.Kill(5),
		"stop":    c.Stop(-1),
		"restart": c.Restart(1),
	} {
		if !errors.Is(err, ErrBadIndex) {
			t.Errorf("%s of a bad index = %v, want ErrBadIndex", name, err)
		}
	}
	if c.Node(3) != nil || c.Name(3) != "" {
		t.Error("Node/Name of a bad index not empty")
	}
	if _, err := Start(context.Background(), 0); !errors.Is(err, ErrBadIndex) {
		t.Errorf("Start(0) = %v, want ErrBadIndex", err)
	}
}

// TestCheckerCatchesInjectedBugs breaks the receiving handler from outside
// node (see Bug) and shows the checker reports it.
func TestCheckerCatchesInjectedBugs(t *testing.T) {
	tests := []struct {
		bug  Bug
		what func(Report) int
	}{
		{BugAckWithoutProcessing, func(r Report) int { return len(r.Lost) }},
		{BugDoubleApply, func(r Report) int { return len(r.Duplicates) }},
	}
	for _, tc := range tests {
		t.Run(map[Bug]string{BugAckWithoutProcessing: "ack without processing", BugDoubleApply: "double apply"}[tc.bug], func(t *testing.T) {
			rec := NewRecorder(3)
			c := New(t, 2, sinks(rec, tc.bug))
			for range 30 {
				if _, err := SendReliable(context.Background(), rec, c.Node(0), c.Addr("sink", 1)); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.WaitDrained(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			rep, err := c.Check(rec)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() || tc.what(rep) != 3 {
				t.Fatalf("checker missed the injected bug (want 3 violations):\n%s", rep)
			}
		})
	}
}

// A node whose disk is full refuses to store what it sends (the caller is
// told, with ENOSPC) and cannot record what it receives; once FreeDisks
// lets it write again, everything acknowledged is delivered, once, in
// order, and nothing healthy is in a dead-letter queue.
func TestClusterDiskFull(t *testing.T) {
	rec := NewRecorder(2)
	c := New(t, 2, sinks(rec, NoBug))
	ctx := context.Background()

	c.DiskFull(0)
	c.Partition([]int{0}, []int{1})
	testutil.WaitFor(t, 10*time.Second, "n0 sees n1 down", func() bool { return !c.Sees(0, 1) })
	if _, err := SendReliable(ctx, rec, c.Node(0), c.Addr("sink", 1)); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a send to be stored on a full disk: %v, want ENOSPC", err)
	}
	c.Heal()
	c.FreeDisks()
	if err := c.WaitConverged(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	c.DiskFull(1) // the receiver's: it cannot record what it runs
	for range 10 {
		if out, err := SendReliable(ctx, rec, c.Node(0), c.Addr("sink", 1)); err != nil || out == node.DeadLettered {
			t.Fatalf("send to a node with a full disk = %v, %v", out, err)
		}
	}
	c.FreeDisks()
	rep := drainedAndChecked(t, c, rec, 30*time.Second)
	if rep.Processed != 10 {
		t.Fatalf("unexpected counts:\n%s", rep)
	}
}

// A node whose disk fails the sync of an outbox commit stops its outbox:
// a send to be stored fails at the call (ErrStoreFailed) and, as a
// receiver, it runs nothing. A Restart of it (a kill first: it still runs)
// brings it back on what the file holds; then everything acknowledged is
// delivered, once, in order, and nothing healthy is in a dead-letter queue.
func TestClusterSyncFail(t *testing.T) {
	rec := NewRecorder(3)
	c := New(t, 2, sinks(rec, NoBug))
	ctx := context.Background()
	for range 3 {
		if _, err := SendReliable(ctx, rec, c.Node(0), c.Addr("sink", 1)); err != nil {
			t.Fatal(err)
		}
	}
	c.SyncFail(1) // the receiver's: its next watermark commit stops it
	for range 5 {
		if out, err := SendReliable(ctx, rec, c.Node(0), c.Addr("sink", 1)); err != nil || out == node.DeadLettered {
			t.Fatalf("send to a node whose store failed = %v, %v", out, err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "n1's outbox to stop", func() bool { return c.Node(1).Outbox().Err() != nil })

	c.Partition([]int{0}, []int{1})
	testutil.WaitFor(t, 10*time.Second, "n0 sees n1 down", func() bool { return !c.Sees(0, 1) })
	c.SyncFail(0) // the sender's: the next send to be stored stops it
	_, err := SendReliable(ctx, rec, c.Node(0), c.Addr("sink", 1))
	if !errors.Is(err, node.ErrStoreFailed) {
		t.Fatalf("a send to be stored when the disk fails its sync: %v, want ErrStoreFailed", err)
	}
	if _, err := SendReliable(ctx, rec, c.Node(0), c.Addr("sink", 1)); !errors.Is(err, node.ErrStoreFailed) {
		t.Fatalf("a send after the outbox stopped: %v, want ErrStoreFailed", err)
	}
	c.Heal()
	if err := c.apply(FaultStep{Kind: FaultRestart, Node: 0}); err != nil {
		t.Fatal(err)
	}
	if err := c.apply(FaultStep{Kind: FaultRestart, Node: 1}); err != nil {
		t.Fatal(err)
	}
	rep := drainedAndChecked(t, c, rec, 30*time.Second)
	if rep.Processed < 8 || rep.Processed > 9 {
		t.Fatalf("processed %d, want the 8 acknowledged and perhaps the one whose commit failed:\n%s", rep.Processed, rep)
	}
}

// drainedAndChecked waits for c to converge and drain, then checks what
// rec recorded and fails tb on a broken invariant.
func drainedAndChecked(tb testing.TB, c *Cluster, rec *Recorder, drain time.Duration) Report {
	tb.Helper()
	if err := c.WaitConverged(10 * time.Second); err != nil {
		tb.Fatal(err)
	}
	if err := c.WaitDrained(drain); err != nil {
		tb.Fatal(err)
	}
	rep, err := c.Check(rec)
	if err != nil {
		tb.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		tb.Fatal(err)
	}
	return rep
}

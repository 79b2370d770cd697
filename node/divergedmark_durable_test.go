package node_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// a ran at sequence 1; x, a restored sender's new message under the same
// sequence, marks the stream divergent while the disk refuses commits.
// DIVERGED makes the sender send the old epoch's messages again in a new
// one, so it must not go out before the mark is on disk: a receiver that
// crashed in between would load the stream unmarked and run y of the old
// epoch (chained to the watermark, still on its way through a forwarder)
// beside its copy in the new epoch. While the mark is not durable x is
// answered CAPACITY (the sender asks again); once the disk takes the
// commit, DIVERGED; and after a restart y of the old epoch does not run.
func TestDivergedIsAnsweredOnlyOnceItsMarkIsOnDisk(t *testing.T) {
	t.Run("actor present", func(t *testing.T) { divergedAfterMarkDurable(t, false) })
	t.Run("actor absent", func(t *testing.T) { divergedAfterMarkDurable(t, true) })
}

func divergedAfterMarkDurable(t *testing.T, absent bool) {
	dir := t.TempDir()
	n := newNode(t, "n1", dir, func(c *node.Config) {})
	var s sink
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	if c := rs.deliverWait(t, n, epochEnv(t, 1, 1, 0, "a")).GetCode(); c != pb.Receipt_PROCESSED {
		t.Fatalf("a: %v", c)
	}
	if absent {
		if err := n.Stop("sink"); err != nil {
			t.Fatal(err)
		}
	}
	restore, hits := faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
	rc := rs.deliverWait(t, n, epochEnv(t, 1, 1, 0, "x"))
	if rc.GetCode() != pb.Receipt_CAPACITY || !strings.Contains(rc.GetMessage(), "divergence not durable") {
		t.Fatalf("x while the disk refuses the mark (%d commits refused): %v %q, want CAPACITY: a DIVERGED before the mark is on disk is forgotten by a crash", hits(), rc.GetCode(), rc.GetMessage())
	}
	restore()
	x2 := epochEnv(t, 1, 1, 0, "x")
	x2.MsgId = "x-again"
	if rc := rs.deliverWait(t, n, x2); rc.GetCode() != pb.Receipt_DIVERGED {
		t.Fatalf("x sent again once the disk takes commits: %v %q, want DIVERGED", rc.GetCode(), rc.GetMessage())
	}
	// Told DIVERGED, the sender may rely on the mark: it outlives a restart.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = newNode(t, "n1", dir, func(c *node.Config) {})
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	if rc := rs.deliverWait(t, n, epochEnv(t, 1, 2, 1, "y")); rc.GetCode() != pb.Receipt_DIVERGED {
		t.Fatalf("y of the old epoch after a restart: %v %q, want DIVERGED", rc.GetCode(), rc.GetMessage())
	}
	noOldEpochRan(t, s.values())
}

package node_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
)

// openBox opens an inbox file at path with the inbox "box" declared; it
// is closed when the test ends.
func openBox(t *testing.T, path string) *inbox.Store {
	t.Helper()
	st, err := inbox.Open(inbox.DefaultConfig(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Declare("box"); err != nil {
		t.Fatal(err)
	}
	return st
}

// spawnBox spawns "box" on n as the daemon spawns an inbox actor.
func spawnBox(t *testing.T, n *node.Node, st *inbox.Store) {
	t.Helper()
	if _, err := n.Spawn("box", inbox.Handler(st, "box"), inbox.SpawnOptions(st, "box")...); err != nil {
		t.Fatal(err)
	}
}

// boxResponder returns how to start (and start again, on the same data
// directory below dir) node n1 with st's "box" actor, joined to n0.
func boxResponder(t *testing.T, dir string, n0 *node.Node, st *inbox.Store) func() *node.Node {
	return func() *node.Node {
		t.Helper()
		n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries, n0.GossipAddr())
		spawnBox(t, n1, st)
		waitAlive(t, []*node.Node{n0, n1}, 2)
		return n1
	}
}

// storedThenRestarted calls send (from n0 to n1's "box") while n1's
// outbox.db refuses commits, as a crash before the watermark's commit
// would lose it; waits until the inbox committed the message (what says
// which) and n1's commit was refused; then starts n1 again on its data
// directory (start1), the disk healthy, and waits until n0's outbox drained:
// the copy was acknowledged.
func storedThenRestarted(t *testing.T, dir string, n0, n1 *node.Node, st *inbox.Store, start1 func() *node.Node, what string, send func()) {
	t.Helper()
	restore, hits := faults.FailCommits(filepath.Join(dir, "n1", "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()
	send()
	testutil.WaitFor(t, 15*time.Second, what, func() bool {
		return st.Stats()["box"].LastCursor == 1 && hits() >= 1 // committed, not only begun
	})
	if err := n1.Close(); err != nil {
		t.Logf("close n1: %v", err)
	}
	restore()
	start1() // the node back on its data directory (closed by the test's cleanup)
	testutil.WaitFor(t, 20*time.Second, "n0's outbox drained (the copy acknowledged)", func() bool {
		return n0.Outbox().Stats().Depth == 0
	})
}

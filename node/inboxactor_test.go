package node_test

import (
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/internal/inbox"
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

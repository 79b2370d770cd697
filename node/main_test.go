package node_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/transport"
)

// TestMain checks that no goroutine outlives the tests.
//
// Tests that spend their time waiting on real time (a TTL running out, a
// retry's backoff, a peer declared dead) and take little CPU call
// t.Parallel: Go runs them together once the other tests are done (up to
// -parallel at once; `make test` passes 4). A test that changes anything
// shared by the package (a hook on a package variable, an environment
// variable) must not.
func TestMain(m *testing.M) { testutil.VerifyTestMain(m) }

var (
	caOnce sync.Once
	ca     *transport.CA
	caErr  error
)

func testCA(tb testing.TB) *transport.CA {
	tb.Helper()
	caOnce.Do(func() { ca, caErr = transport.NewCA("meshnode test CA", 24*time.Hour) })
	if caErr != nil {
		tb.Fatalf("NewCA: %v", caErr)
	}
	return ca
}

// testConfig returns a loopback config for name with its own data dir.
func testConfig(tb testing.TB, name string, dir string) node.Config {
	tb.Helper()
	id, err := testCA(tb).NewIdentity(name)
	if err != nil {
		tb.Fatalf("identity %s: %v", name, err)
	}
	cfg := node.DefaultConfig(name)
	cfg.Cluster = "test"
	cfg.DataDir = dir
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.QUICAddr = "127.0.0.1:0"
	cfg.TLS = id
	if os.Getenv("MESHNODE_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

// startNode starts a node that joins the given seeds and closes it at cleanup.
func startNode(tb testing.TB, name string, dir string, join ...string) *node.Node {
	tb.Helper()
	cfg := testConfig(tb, name, dir)
	cfg.Join = join
	n, err := node.New(cfg)
	if err != nil {
		tb.Fatalf("node.New(%s): %v", name, err)
	}
	tb.Cleanup(func() { _ = n.Close() })
	return n
}

// startNodeWith is startNode with a config edit.
func startNodeWith(tb testing.TB, name, dir string, edit func(*node.Config), join ...string) *node.Node {
	tb.Helper()
	cfg := testConfig(tb, name, dir)
	cfg.Join = join
	edit(&cfg)
	n, err := node.New(cfg)
	if err != nil {
		tb.Fatalf("node.New(%s): %v", name, err)
	}
	tb.Cleanup(func() { _ = n.Close() })
	return n
}

// cluster starts k nodes n1..nk joined to n1 and waits until all see all.
func cluster(tb testing.TB, k int) []*node.Node {
	tb.Helper()
	nodes := make([]*node.Node, k)
	for i := range nodes {
		var join []string
		if i > 0 {
			join = []string{nodes[0].GossipAddr()}
		}
		nodes[i] = startNode(tb, nodeName(i), filepath.Join(tb.TempDir(), nodeName(i)), join...)
	}
	waitAlive(tb, nodes, k)
	return nodes
}

func nodeName(i int) string { return "n" + string(rune('1'+i)) }

func waitAlive(tb testing.TB, nodes []*node.Node, k int) {
	tb.Helper()
	testutil.WaitFor(tb, 10*time.Second, "cluster converged", func() bool {
		for _, n := range nodes {
			alive := 0
			for _, m := range n.Members() {
				if m.State.String() == "alive" {
					alive++
				}
			}
			if alive != k {
				return false
			}
		}
		return true
	})
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

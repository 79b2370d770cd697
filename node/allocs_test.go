//go:build !race

// The race detector drops sync.Pool puts at random, so allocation counts
// are only meaningful without it.

package node_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Allocations per message on the hot paths, both nodes together, as this
// test logs them (the figure in each comment; the benchmarks
// `go test -run '^$' -bench 'Remote(Tell|Ask)$|TellReliable(Async)?Offline' -benchmem ./node`
// give the same paths without the test's background), plus headroom for
// what the nodes' background work (gossip, timers) allocates during a run.
// `make test` runs this test without the race detector (`make
// test-allocs`). A change that makes a path allocate more fails here:
// lower the bound with the gain, raise it only with a reason.
const (
	maxAllocsTell     = 4   // remote Tell: 2.2
	maxAllocsLocal    = 3   // Tell to an actor on the same node: 2.0
	maxAllocsAsk      = 18  // remote Ask round trip: 16.2
	maxAllocsReliable = 190 // TellReliable to an offline peer, one caller (one commit each): 157
	maxAllocsAsync    = 24  // TellReliableAsync to an offline peer, one producer (hundreds per commit): 19.2
	maxAllocsDirect   = 220 // TellReliable delivered at once to an online actor, the receiver committing each watermark (this test's log): 192
)

// allocsPer returns the allocations of the whole process per message while
// send sends k messages and waits until they took effect.
func allocsPer(k int, send func()) float64 {
	return testing.AllocsPerRun(3, send) / float64(k)
}

func TestAllocsPerMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("measures; not in -short")
	}
	nodes := cluster(t, 2)
	ctx := context.Background()
	var got atomic.Int64
	to, err := nodes[1].Spawn("c", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		got.Add(1)
		return payload128, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	const k = 500
	check := func(name string, allocs float64, limit int) {
		t.Helper()
		t.Logf("%s: %.1f allocs/msg (limit %d)", name, allocs, limit)
		if allocs > float64(limit) {
			t.Errorf("%s allocates %.1f per message, more than %d", name, allocs, limit)
		}
	}
	// tells sends k tells from one node and waits until they ran.
	tells := func(from *node.Node) func() {
		return func() {
			start := got.Load()
			for range k {
				if err := from.Tell(ctx, to, payload128); err != nil {
					t.Fatal(err)
				}
			}
			testutil.WaitFor(t, 10*time.Second, "tells handled", func() bool { return got.Load() >= start+k })
		}
	}
	check("tell", allocsPer(k, tells(nodes[0])), maxAllocsTell)
	check("local tell", allocsPer(k, tells(nodes[1])), maxAllocsLocal)
	var resp wrapperspb.BytesValue
	check("ask", allocsPer(k, func() {
		for range k {
			if err := nodes[0].Ask(ctx, to, payload128, &resp); err != nil {
				t.Fatal(err)
			}
		}
	}), maxAllocsAsk)
	const kr = 50 // one commit each: slow on purpose
	offline := node.Addr("w", "offline")
	check("tell-reliable", allocsPer(kr, func() {
		for range kr {
			if _, err := nodes[0].TellReliable(ctx, offline, payload128); err != nil {
				t.Fatal(err)
			}
		}
	}), maxAllocsReliable)
	check("tell-reliable-direct", allocsPer(kr, func() {
		for range kr {
			if out, err := nodes[0].TellReliable(ctx, to, payload128); err != nil || out != node.Delivered {
				t.Fatalf("TellReliable to an online actor: %v, %v; want Delivered", out, err)
			}
		}
	}), maxAllocsDirect)
	const ka = 2000
	pendings := make([]*node.Pending, ka)
	check("tell-reliable-async", allocsPer(ka, func() {
		for i := range pendings {
			p, err := nodes[0].TellReliableAsync(ctx, offline, payload128)
			if err != nil {
				t.Fatal(err)
			}
			pendings[i] = p
		}
		for _, p := range pendings {
			if _, err := p.Outcome(); err != nil {
				t.Fatal(err)
			}
		}
	}), maxAllocsAsync)
}

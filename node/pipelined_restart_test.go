package node_test

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Several producers pipeline TellReliableAsync (and some TellReliable) to
// the same actor while its node is stopped and restarted mid-flight:
// every message whose Pending said Queued runs exactly once, each
// producer's in call order.
func TestPipelinedProducersThroughAReceiverRestartRunOnceInOrder(t *testing.T) {
	dir := t.TempDir()
	n1 := startNode(t, "n1", filepath.Join(dir, "n1"))
	n2dir := filepath.Join(dir, "n2")
	var s sink
	n2 := startNode(t, "n2", n2dir, n1.GossipAddr())
	n2.Spawn("sink", s.handler)
	waitAlive(t, []*node.Node{n1, n2}, 2)
	ctx := ctxT(t)
	to := node.Addr("sink", "n2")
	const producers, per = 4, 800
	type res struct {
		v string
		p *node.Pending
		e error
	}
	out := make([][]res, producers)
	var wg sync.WaitGroup
	for g := range producers {
		wg.Go(func() {
			for i := range per {
				v := fmt.Sprintf("g%d-%04d", g, i)
				if g == 0 && i%40 == 39 {
					o, err := n1.TellReliable(ctx, to, wrapperspb.String(v))
					if err == nil && o != node.Queued && o != node.Delivered {
						err = fmt.Errorf("outcome %v", o)
					}
					out[g] = append(out[g], res{v: v, e: err})
					continue
				}
				p, err := n1.TellReliableAsync(ctx, to, wrapperspb.String(v))
				out[g] = append(out[g], res{v: v, p: p, e: err})
			}
		})
	}
	testutil.WaitFor(t, 10*time.Second, "some delivered", func() bool { return len(s.values()) > 200 })
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	n2 = startNode(t, "n2", n2dir, n1.GossipAddr())
	n2.Spawn("sink", s.handler)
	wg.Wait()
	queued := map[string]bool{}
	for g := range producers {
		for _, r := range out[g] {
			if r.e != nil {
				t.Fatalf("%s: %v", r.v, r.e)
			}
			if r.p != nil {
				o, err := r.p.Wait(ctx)
				if err != nil || o != node.Queued {
					t.Fatalf("%s: pending %v, %v", r.v, o, err)
				}
			}
			queued[r.v] = true
		}
	}
	testutil.WaitFor(t, 20*time.Second, "outbox drained", func() bool { return n1.Outbox().Stats().Depth == 0 && len(s.values()) >= len(queued) })
	got := s.values()
	seen := map[string]int{}
	last := map[byte]string{}
	for _, v := range got {
		seen[v]++
		if l, ok := last[v[1]]; ok && l >= v {
			t.Errorf("producer %c: %s ran after %s", v[1], v, l)
		}
		last[v[1]] = v
	}
	for v := range queued {
		if seen[v] != 1 {
			t.Errorf("%s ran %d times", v, seen[v])
		}
	}
	if len(got) != len(queued) {
		t.Errorf("ran %d, sent %d", len(got), len(queued))
	}
}

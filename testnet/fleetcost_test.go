package testnet

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestFleetCost measures what a fleet of whole nodes costs per node at
// rest: MESHNODE_FLEET_NODES=200 starts that many nodes in this process,
// has every device send one reliable message to one of 3 collectors and
// every collector one to each of its devices (so the connections a fleet
// uses are open), then watches a quiet window and reports per node: Go
// heap, anonymous RSS, goroutines, open QUIC connections and gossip bytes
// sent per second. Not part of make test (make fleet-cost runs it):
//
//	MESHNODE_FLEET_NODES=200 go test -run TestFleetCost -v -timeout 20m ./testnet/
func TestFleetCost(t *testing.T) {
	v := os.Getenv("MESHNODE_FLEET_NODES")
	if v == "" {
		t.Skip("set MESHNODE_FLEET_NODES=200 to measure a fleet's cost per node")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < fleetCollectors+1 {
		t.Fatalf("MESHNODE_FLEET_NODES=%q: want a number > %d", v, fleetCollectors)
	}
	window := 30 * time.Second
	var ran atomic.Int64
	begin := time.Now()
	c, err := Start(context.Background(), n, WithConvergeTimeout(2*time.Minute), WithSpawn(func(i int, nd *node.Node) error {
		_, err := nd.Spawn("inbox", func(context.Context, *node.Message) (proto.Message, error) {
			ran.Add(1)
			return nil, nil
		})
		return err
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	t.Logf("%d nodes started and converged in %v", n, time.Since(begin).Round(100*time.Millisecond))

	ctx := context.Background()
	sent := 0
	for d := fleetCollectors; d < n; d++ {
		col := d % fleetCollectors
		for _, p := range [][2]int{{d, col}, {col, d}} {
			if _, err := c.Node(p[0]).TellReliable(ctx, c.Addr("inbox", p[1]), wrapperspb.UInt64(uint64(d))); err != nil {
				t.Fatalf("%s -> %s: %v", c.Name(p[0]), c.Name(p[1]), err)
			}
			sent++
		}
	}
	testutil.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d messages ran", sent), func() bool { return ran.Load() == int64(sent) })

	gossip := func() (b uint64) {
		for _, i := range c.Running() {
			b += c.Node(i).Stats().Gossip.Sent
		}
		return b
	}
	g0, t0 := gossip(), time.Now()
	deadline := t0.Add(window)
	testutil.WaitFor(t, window+time.Minute, "the quiet window", func() bool { return time.Now().After(deadline) })
	bps := float64(gossip()-g0) / time.Since(t0).Seconds() / float64(n)

	var conns, maxConns int
	for _, i := range c.Running() {
		k := 0
		for _, p := range c.Node(i).PeerStats() {
			if p.Connected {
				k++
			}
		}
		conns += k
		maxConns = max(maxConns, k)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("per node at %d nodes: %.0f KiB Go heap in use, %.0f KiB anonymous RSS, %.1f goroutines, %.1f QUIC connections open (max %d), %.0f B/s gossip sent",
		n, float64(ms.HeapInuse)/1024/float64(n), float64(rssAnon())/1024/float64(n), float64(runtime.NumGoroutine())/float64(n),
		float64(conns)/float64(n), maxConns, bps)
	if bps <= 0 {
		t.Errorf("no gossip counted in %v", window)
	}
}

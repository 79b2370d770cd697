package partition

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// downDeliverer is nopDeliverer with nodes that can be marked down.
type downDeliverer struct {
	nopDeliverer
	// mu guards the field below.
	mu   sync.Mutex
	down map[string]bool
}

func (d *downDeliverer) Alive(node string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.down[node]
}

func (d *downDeliverer) setDown(node string, down bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down[node] = down
}

// peerState counts what the relay keeps per peer in memory.
func (r *Relay) peerState() (limiters, routes, streams int) {
	r.lmu.Lock()
	limiters = len(r.limiters)
	r.lmu.Unlock()
	r.routes.mu.Lock()
	routes = len(r.routes.peers)
	r.routes.mu.Unlock()
	for _, p := range r.parts {
		p.mu.Lock()
		streams += len(p.streams)
		p.mu.Unlock()
	}
	return limiters, routes, streams
}

func storeOne(tb testing.TB, r *Relay, rcpt string) {
	tb.Helper()
	sm := &pb.StoredMessage{
		Envelope:         &pb.Envelope{Recipient: rcpt, Sender: "app@n0", Type: "x", MsgId: rcpt},
		CreatedElapsedMs: r.store.ElapsedMs(),
	}
	if err := r.Store(context.Background(), []*pb.StoredMessage{sm})[0]; err != nil {
		tb.Fatal(err)
	}
}

// churn delivers one message to each of peers distinct nodes; every one
// then leaves with nothing queued.
func churn(tb testing.TB, r *Relay, peers int) {
	tb.Helper()
	before := r.delivered.Load()
	for i := range peers {
		node := fmt.Sprintf("gone%05d", i)
		storeOne(tb, r, "a@"+node)
		r.routes.mu.Lock()
		r.routes.peers[node] = &route{misses: 1} // as after a failed emission
		r.routes.mu.Unlock()
	}
	testutil.WaitFor(tb, 30*time.Second, "every peer delivered to", func() bool {
		return r.delivered.Load() == before+uint64(peers) && r.store.Stats().Depth == 0
	})
}

// Peers that come and go leave nothing behind once forgotten: the maps
// shrink back to what they held before the churn.
func TestForgetPeerChurn(t *testing.T) {
	d := &downDeliverer{down: map[string]bool{}}
	r := newTestRelay(t, d)
	r.Start()
	const peers = 1000
	churn(t, r, peers)
	if l, rt, _ := r.peerState(); l != peers || rt != peers {
		t.Fatalf("after the churn: %d limiters, %d routes; want %d each", l, rt, peers)
	}
	for i := range peers {
		node := fmt.Sprintf("gone%05d", i)
		d.setDown(node, true)
		if !r.ForgetPeer(node) {
			t.Fatalf("ForgetPeer(%s) refused with nothing queued", node)
		}
	}
	if l, rt, s := r.peerState(); l != 0 || rt != 0 || s != 0 {
		t.Fatalf("after ForgetPeer of every peer: %d limiters, %d routes, %d streams", l, rt, s)
	}
	if n := r.store.ExcludedNodes(); n != 0 {
		t.Fatalf("%d nodes still excluded", n)
	}
}

// A forgotten peer that comes back gets fresh state and its messages are
// delivered as before.
func TestForgottenPeerComesBack(t *testing.T) {
	d := &downDeliverer{down: map[string]bool{}}
	r := newTestRelay(t, d)
	r.Start()
	churn(t, r, 1)
	r.Limiter("gone00000").OnCapacity()
	d.setDown("gone00000", true)
	if !r.ForgetPeer("gone00000") {
		t.Fatal("ForgetPeer refused with nothing queued")
	}
	d.setDown("gone00000", false)
	r.NodeAlive("gone00000")
	storeOne(t, r, "b@gone00000")
	testutil.WaitFor(t, wait10s, "delivered after the return", func() bool {
		return r.delivered.Load() == 2 && r.store.Stats().Depth == 0
	})
	if got := r.Limiter("gone00000").Limit(); got < DefaultLimiterConfig().Initial {
		t.Fatalf("limit after the return %d: the halved limiter was kept", got)
	}
}

// A departed peer with messages queued for it keeps its state; once they
// are delivered it can be forgotten.
func TestForgetPeerKeepsQueued(t *testing.T) {
	d := &downDeliverer{down: map[string]bool{"n1": true}}
	r := newTestRelay(t, d)
	r.Start()
	storeOne(t, r, "a@n1")
	testutil.WaitFor(t, wait10s, "the down peer's recipient deferred", func() bool { return r.deferred.Load() > 0 })
	if r.ForgetPeer("n1") {
		t.Fatal("ForgetPeer forgot a peer with a message queued")
	}
	if l, _, _ := r.peerState(); l != 1 {
		t.Fatalf("%d limiters after a refused ForgetPeer, want 1", l)
	}
	held := r.Limiter("n2")
	held.TryAcquire(1)
	if r.ForgetPeer("n2") {
		t.Fatal("ForgetPeer forgot a peer with a slot in flight")
	}
	held.Release(1)
	d.setDown("n1", false)
	r.NodeAlive("n1")
	testutil.WaitFor(t, wait10s, "delivered", func() bool { return r.store.Stats().Depth == 0 && r.delivered.Load() == 1 })
	testutil.WaitFor(t, wait10s, "n1 forgotten once drained", func() bool { return r.ForgetPeer("n1") })
}

const wait10s = 10 * time.Second

// BenchmarkDepartedPeerMemory reports the heap kept per departed peer
// (one message delivered to it, then it left with nothing queued): kept,
// when nothing forgets it (what a dead peer cost before the relay's
// ForgetPeer was called after a grace period), and after ForgetPeer.
//
//	go test -run '^$' -bench BenchmarkDepartedPeerMemory -count 3 ./partition
func BenchmarkDepartedPeerMemory(b *testing.B) {
	const peers = 1000
	for range b.N {
		d := &downDeliverer{down: map[string]bool{}}
		r := newTestRelay(b, d)
		r.Start()
		base := heapNow()
		churn(b, r, peers)
		kept := heapNow()
		for i := range peers {
			node := fmt.Sprintf("gone%05d", i)
			d.setDown(node, true)
			r.ForgetPeer(node)
		}
		pruned := heapNow()
		b.ReportMetric(float64(int64(kept)-int64(base))/peers, "B/peer-kept")
		b.ReportMetric(float64(int64(pruned)-int64(base))/peers, "B/peer-pruned")
	}
}

func heapNow() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

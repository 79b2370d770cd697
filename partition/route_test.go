package partition_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

// router is the fake with a Router: the direct path to a node can be cut
// while membership holds it alive, and forwarders carry emissions to the
// same receiver (or fail to, when broken).
type router struct {
	*fake

	// rmu guards the fields below.
	rmu      sync.Mutex
	cut      map[string]bool // node: the direct path fails as unreachable
	fwds     []string        // Forwarders, sorted
	broken   map[string]bool // forwarder: brings no receipt
	cold     map[string]int  // forwarder: brings no receipt for this many more emissions (dialing)
	viaCalls map[string]int  // forwarder: DeliverVia calls
	direct   int             // Deliver calls that reached the receiver
	probes   int
}

func newRouter() *router {
	rt := &router{fake: newFake(), cut: map[string]bool{}, broken: map[string]bool{}, cold: map[string]int{}, viaCalls: map[string]int{}}
	rt.intercept = func(_ context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
		node := envs[0].GetRecipient()[len("a@"):]
		rt.rmu.Lock()
		defer rt.rmu.Unlock()
		if rt.cut[node] {
			return nil, fmt.Errorf("fake: dial %s: %w", node, partition.ErrUnreachable), true
		}
		rt.direct++
		return nil, nil, false
	}
	return rt
}

func (rt *router) with(fn func(rt *router)) {
	rt.rmu.Lock()
	defer rt.rmu.Unlock()
	fn(rt)
}

func (rt *router) Forwarders(string) []string {
	rt.rmu.Lock()
	defer rt.rmu.Unlock()
	return slices.Clone(rt.fwds)
}

func (rt *router) DeliverVia(_ context.Context, via, node string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	rt.rmu.Lock()
	rt.viaCalls[via]++
	broken := rt.broken[via] || rt.cold[via] > 0
	rt.cold[via]--
	rt.rmu.Unlock()
	if broken {
		return make([]*pb.Receipt, len(envs)), fmt.Errorf("fake: %s brought no receipt from %s", via, node)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rcs := make([]*pb.Receipt, len(envs))
	for i, e := range envs {
		rcs[i] = rt.receive(e)
	}
	return rcs, nil
}

func (rt *router) Probe(_ context.Context, node string) error {
	rt.rmu.Lock()
	defer rt.rmu.Unlock()
	rt.probes++
	if rt.cut[node] {
		return fmt.Errorf("fake: probe %s: %w", node, partition.ErrUnreachable)
	}
	return nil
}

func (rt *router) counts() (direct int, via map[string]int) {
	rt.rmu.Lock()
	defer rt.rmu.Unlock()
	return rt.direct, maps.Clone(rt.viaCalls)
}

// routeRig is a started relay over rt with fast forwarding.
func routeRig(t *testing.T, rt *router, fwd partition.ForwardConfig) *rig {
	t.Helper()
	rg := newRig(t, nil, func(c *partition.Config) { c.Forward = fwd })
	// Rebuild the relay over the router (newRig made it over a plain fake).
	_ = rg.relay.Close()
	rcfg := partition.DefaultConfig()
	rcfg.Backoff, rcfg.Logger, rcfg.Forward = fastBackoff, quiet, fwd
	rcfg.BatchSize = 16
	var err error
	if rg.relay, err = partition.New(rcfg, rg.store, rt); err != nil {
		t.Fatal(err)
	}
	rg.fake = rt.fake
	rg.relay.Start()
	return rg
}

func typs(prefix string, from, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%04d", prefix, from+i)
	}
	return out
}

// A peer alive in membership whose direct path fails gets its streams
// through a forwarder: every message runs once, in order; when the direct
// path works again (the probe), they go direct.
func TestForwardWhileTheDirectPathIsCut(t *testing.T) {
	rt := newRouter()
	rt.with(func(rt *router) { rt.cut["n1"], rt.fwds = true, []string{"f1"} })
	rg := routeRig(t, rt, partition.ForwardConfig{After: 2, Probe: 20 * time.Millisecond})

	first := typs("m", 0, 200)
	rg.queue(t, "a@n1", first...)
	testutil.WaitFor(t, wait, "all delivered through the forwarder", func() bool { return rt.ranCount("a@n1") == len(first) })
	if got := rt.ranTypes("a@n1"); !slices.Equal(got, first) {
		t.Fatalf("ran %v, want %v in order once each", got, first)
	}
	direct, via := rt.counts()
	if direct != 0 || via["f1"] == 0 {
		t.Fatalf("direct emissions %d, through f1 %d: want none direct, some through f1", direct, via["f1"])
	}
	if r := rg.relay.Routes()["n1"]; r.Via != "f1" || r.Misses < 2 {
		t.Fatalf("route of n1 = %+v, want via f1 after 2 misses", r)
	}
	if s := rg.relay.Stats(); s.Forwarded != uint64(len(first)) || s.Reroutes != 1 {
		t.Fatalf("stats: forwarded %d, reroutes %d; want %d, 1", s.Forwarded, s.Reroutes, len(first))
	}

	// The heal: with traffic, the next probe finds the direct path and
	// the streams go back (an idle forwarded peer is not probed).
	rt.with(func(rt *router) { rt.cut["n1"] = false })
	all := first
	for i := 0; len(rg.relay.Routes()) != 0; i++ {
		if i == 100 {
			t.Fatal("the route did not go back to direct after the heal")
		}
		more := typs("m", len(all), 10)
		rg.queue(t, "a@n1", more...)
		all = append(all, more...)
		testutil.WaitFor(t, wait, "delivered", func() bool { return rt.ranCount("a@n1") == len(all) })
	}
	_, via = rt.counts()
	last := typs("m", len(all), 100)
	rg.queue(t, "a@n1", last...)
	all = append(all, last...)
	testutil.WaitFor(t, wait, "all delivered directly", func() bool { return rt.ranCount("a@n1") == len(all) })
	if got := rt.ranTypes("a@n1"); !slices.Equal(got, all) {
		t.Fatalf("ran out of order or twice across the heal: %v", got)
	}
	direct2, via2 := rt.counts()
	if direct2 == 0 || via2["f1"] != via["f1"] {
		t.Fatalf("after the heal: %d direct emissions, %d through f1 (was %d): want direct only", direct2, via2["f1"], via["f1"])
	}
	if s := rg.relay.Stats(); s.Reroutes != 2 {
		t.Fatalf("reroutes %d, want 2 (to the forwarder and back)", s.Reroutes)
	}
	noDeadLetters(t, rg)
}

// A forwarder that brings no receipt (down, cut from the peer, or what it
// carried was refused) is replaced by the next one; its failures are never
// counted against the messages.
func TestForwarderRotatesOnFailure(t *testing.T) {
	rt := newRouter()
	rt.with(func(rt *router) {
		rt.cut["n1"], rt.fwds, rt.broken["f1"] = true, []string{"f1", "f2"}, true
	})
	rg := routeRig(t, rt, partition.ForwardConfig{After: 1, Probe: time.Hour})
	msgs := typs("m", 0, 50)
	rg.queue(t, "a@n1", msgs...)
	testutil.WaitFor(t, wait, "all delivered through f2", func() bool { return rt.ranCount("a@n1") == len(msgs) })
	if got := rt.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v", got)
	}
	_, via := rt.counts()
	if via["f1"] == 0 || via["f2"] == 0 {
		t.Fatalf("through f1 %d, f2 %d: want f1 tried, then f2", via["f1"], via["f2"])
	}
	if r := rg.relay.Routes()["n1"]; r.Via != "f2" {
		t.Fatalf("route = %+v, want via f2", r)
	}
	noDeadLetters(t, rg)
}

// With nobody to forward, the messages wait (deferred, uncounted, not
// dead-lettered) and go as soon as the direct path is back.
func TestNoForwarderWaitsForTheHeal(t *testing.T) {
	rt := newRouter()
	rt.with(func(rt *router) { rt.cut["n1"] = true })
	rg := routeRig(t, rt, partition.ForwardConfig{After: 2, Probe: 20 * time.Millisecond})
	msgs := typs("m", 0, 30)
	rg.queue(t, "a@n1", msgs...)
	testutil.WaitFor(t, wait, "n1 forwarded, without a forwarder", func() bool {
		r, ok := rg.relay.Routes()["n1"]
		return ok && r.Via == ""
	})
	testutil.WaitFor(t, wait, "a few probes", func() bool {
		var p int
		rt.with(func(rt *router) { p = rt.probes })
		return p >= 2
	})
	if n := rt.ranCount("a@n1"); n != 0 {
		t.Fatalf("%d ran through a cut path", n)
	}
	if p := rg.store.Pending("a@n1"); p != len(msgs) {
		t.Fatalf("pending %d, want %d waiting", p, len(msgs))
	}
	rt.with(func(rt *router) { rt.cut["n1"] = false })
	testutil.WaitFor(t, wait, "delivered after the heal", func() bool { return rt.ranCount("a@n1") == len(msgs) })
	if got := rt.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v", got)
	}
	noDeadLetters(t, rg)
}

// Forward.After 0 turns forwarding off: a cut peer waits, and no
// forwarder is ever asked.
func TestForwardingOff(t *testing.T) {
	rt := newRouter()
	rt.with(func(rt *router) { rt.cut["n1"], rt.fwds = true, []string{"f1"} })
	rg := routeRig(t, rt, partition.ForwardConfig{After: 0})
	rg.queue(t, "a@n1", typs("m", 0, 10)...)
	testutil.WaitFor(t, wait, "several failed direct emissions", func() bool { return rt.callCount() >= 5 })
	if _, via := rt.counts(); via["f1"] != 0 || len(rg.relay.Routes()) != 0 {
		t.Fatalf("forwarding off, yet f1 carried %d emissions (routes %v)", via["f1"], rg.relay.Routes())
	}
}

func noDeadLetters(tb testing.TB, rg *rig) {
	tb.Helper()
	if dl, err := rg.store.DeadLetters(outbox.DLQFilter{}); err != nil || len(dl) != 0 {
		tb.Fatalf("dead letters %v (%v), want none", dl, err)
	}
}

// A forwarder's first emission may find it without a connection to the
// recipient yet (it dials): one emission without receipts does not move
// the peer to the next forwarder.
func TestColdForwarderIsKept(t *testing.T) {
	rt := newRouter()
	rt.with(func(rt *router) { rt.cut["n1"], rt.fwds, rt.cold["f1"] = true, []string{"f1", "f2"}, 1 })
	rg := routeRig(t, rt, partition.ForwardConfig{After: 1, Probe: time.Hour})
	msgs := typs("m", 0, 50)
	rg.queue(t, "a@n1", msgs...)
	testutil.WaitFor(t, wait, "all delivered", func() bool { return rt.ranCount("a@n1") == len(msgs) })
	if got := rt.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v", got)
	}
	if _, via := rt.counts(); via["f1"] < 2 || via["f2"] != 0 {
		t.Fatalf("through f1 %d, f2 %d: want f1 kept after its cold start", via["f1"], via["f2"])
	}
}

package mesh_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/mesh"
)

func TestMain(m *testing.M) {
	testutil.VerifyTestMain(m)
}

func TestThreeNodeJoin(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	waitConverged(t, nodes, 5*time.Second)
	for _, n := range nodes {
		members := n.Members()
		if len(members) != 3 {
			t.Fatalf("%s: %d members, want 3", n.LocalName(), len(members))
		}
		for i, want := range nodes {
			got := members[i] // sorted by name, same order as nodes
			if got.Name != want.LocalName() || got.State != mesh.StateAlive ||
				got.QUICAddr != want.cfg.Meta.GetQuicAddr() || got.BootID != want.cfg.Meta.GetBootId() ||
				got.GossipAddr != want.GossipAddr() || got.Cluster != "test" ||
				!slices.Equal(got.ProtocolVersions, pb.SupportedVersions()) || got.Since.IsZero() {
				t.Errorf("%s sees %+v, want name %s quic %s boot %s", n.LocalName(), got,
					want.LocalName(), want.cfg.Meta.GetQuicAddr(), want.cfg.Meta.GetBootId())
			}
			addr, err := n.Resolve(want.LocalName())
			if err != nil || addr != want.cfg.Meta.GetQuicAddr() {
				t.Errorf("%s Resolve(%s) = %q, %v", n.LocalName(), want.LocalName(), addr, err)
			}
			if !n.Alive(want.LocalName()) {
				t.Errorf("%s: Alive(%s) = false", n.LocalName(), want.LocalName())
			}
		}
		if _, err := n.Resolve("nobody"); !errors.Is(err, mesh.ErrUnreachable) {
			t.Errorf("Resolve(nobody) err = %v, want ErrUnreachable", err)
		}
		if n.Alive("nobody") {
			t.Error("Alive(nobody) = true")
		}
	}
	// Every node reports the other two as joined, and never itself.
	for _, n := range nodes {
		testutil.WaitFor(t, 2*time.Second, "join events", func() bool {
			return n.events.count(mesh.EventJoin) == 2
		})
		if n.events.has(mesh.EventJoin, n.LocalName()) {
			t.Errorf("%s got an event about itself", n.LocalName())
		}
	}
}

func TestConverge20(t *testing.T) {
	size := 20
	if testing.Short() {
		size = 10
	}
	begin := time.Now()
	nodes := startCluster(t, size, nil)
	t.Logf("%d nodes started in %v", size, time.Since(begin))
	t.Cleanup(func() {
		if t.Failed() {
			dumpNodes(t, nodes)
		}
	})
	waitConverged(t, nodes, 45*time.Second) // generous: a loaded machine delays probes; speed is measured by make fleet
	t.Logf("%d nodes converged %v after the first start", size, time.Since(begin))
}

func TestKillDetectedAsDead(t *testing.T) {
	nodes := startCluster(t, 4, nil)
	waitConverged(t, nodes, 5*time.Second)
	victim := nodes[3]
	killed := time.Now()
	if err := victim.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := victim.Kill(); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
	testutil.WaitFor(t, 3*time.Second, "victim Dead and unresolvable at all survivors (3 s budget)", func() bool {
		for _, n := range nodes[:3] {
			if _, err := n.Resolve(victim.LocalName()); !errors.Is(err, mesh.ErrUnreachable) {
				return false
			}
			if stateAt(n, victim.LocalName()) != mesh.StateDead {
				return false
			}
		}
		return true
	})
	t.Logf("kill detected as dead at all survivors after %v", time.Since(killed))
	for _, n := range nodes[:3] {
		testutil.WaitFor(t, time.Second, "EventDead", func() bool { return n.events.has(mesh.EventDead, victim.LocalName()) })
		if n.events.has(mesh.EventLeft, victim.LocalName()) {
			t.Errorf("%s reported a killed node as Left", n.LocalName())
		}
		if n.NumAlive() != 3 {
			t.Errorf("%s NumAlive = %d, want 3", n.LocalName(), n.NumAlive())
		}
		if m, ok := n.Member(victim.LocalName()); !ok || m.State != mesh.StateDead {
			t.Errorf("dead member not remembered: %+v %v", m, ok)
		}
	}
}

func TestCloseSeenAsLeft(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	waitConverged(t, nodes, 5*time.Second)
	leaver := nodes[2]
	if err := leaver.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := leaver.Close(); err != nil {
		t.Fatalf("Leave after Close (idempotent): %v", err)
	}
	if _, err := leaver.Join([]string{nodes[0].GossipAddr()}); !errors.Is(err, mesh.ErrClosed) {
		t.Errorf("Join after Close: %v, want ErrClosed", err)
	}
	if err := leaver.UpdateMeta(&pb.NodeMeta{QuicAddr: "x"}); !errors.Is(err, mesh.ErrClosed) {
		t.Errorf("UpdateMeta after Close: %v, want ErrClosed", err)
	}
	for _, n := range nodes[:2] {
		testutil.WaitFor(t, 2*time.Second, "leaver Left", func() bool {
			return stateAt(n, leaver.LocalName()) == mesh.StateLeft && n.events.has(mesh.EventLeft, leaver.LocalName())
		})
		if n.events.has(mesh.EventDead, leaver.LocalName()) {
			t.Errorf("%s reported a leaving node as Dead", n.LocalName())
		}
		if _, err := n.Resolve(leaver.LocalName()); !errors.Is(err, mesh.ErrUnreachable) {
			t.Errorf("Resolve(left) err = %v", err)
		}
	}
	// Close persisted the peers it knew.
	b, err := os.ReadFile(filepath.Join(leaver.cfg.DataDir, "peers.json"))
	if err != nil || !strings.Contains(string(b), nodes[0].GossipAddr()) {
		t.Errorf("peers.json after Close = %q, %v", b, err)
	}
}

// TestEventSequence checks the whole life of two peers as one observer sees it.
func TestEventSequence(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	waitConverged(t, nodes, 5*time.Second)
	obs, crasher, leaver := nodes[0], nodes[1], nodes[2]

	if err := crasher.Kill(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 3*time.Second, "crasher dead", func() bool { return obs.events.has(mesh.EventDead, crasher.LocalName()) })
	cfg := crasher.cfg
	cfg.BindAddr = crasher.GossipAddr() // restart in place, like a daemon
	cfg.Meta = &pb.NodeMeta{QuicAddr: "127.0.0.1:50001", BootId: ident.NewBootID()}
	cfg.Join = []string{obs.GossipAddr()}
	restarted := start(t, cfg)
	testutil.WaitFor(t, 2*time.Second, "restart event", func() bool { return obs.events.has(mesh.EventRestart, crasher.LocalName()) })
	if addr, err := obs.Resolve(crasher.LocalName()); err != nil || addr != "127.0.0.1:50001" {
		t.Errorf("Resolve after restart = %q, %v", addr, err)
	}

	if err := leaver.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 2*time.Second, "leaver left", func() bool { return obs.events.has(mesh.EventLeft, leaver.LocalName()) })

	// Suspicion may or may not precede death, depending on timing.
	if got, want := obs.events.kinds(crasher.LocalName(), mesh.EventSuspect), []mesh.EventKind{mesh.EventJoin, mesh.EventDead, mesh.EventRestart}; !slices.Equal(got, want) {
		t.Errorf("crasher events %v, want %v", got, want)
	}
	if got, want := obs.events.kinds(leaver.LocalName()), []mesh.EventKind{mesh.EventJoin, mesh.EventLeft}; !slices.Equal(got, want) {
		t.Errorf("leaver events %v, want %v", got, want)
	}
	// Metadata update is seen as EventUpdate.
	if err := restarted.UpdateMeta(&pb.NodeMeta{QuicAddr: "127.0.0.1:50002", BootId: cfg.Meta.GetBootId()}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 2*time.Second, "update event", func() bool {
		addr, _ := obs.Resolve(crasher.LocalName())
		return addr == "127.0.0.1:50002" && obs.events.has(mesh.EventUpdate, crasher.LocalName())
	})
	if m, _ := restarted.Member(restarted.LocalName()); m.QUICAddr != "127.0.0.1:50002" {
		t.Errorf("own view after UpdateMeta: %+v", m)
	}
}

func TestRestartSameNameNewBootID(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	waitConverged(t, nodes, 5*time.Second)
	old := nodes[2]
	if err := old.Kill(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 3*time.Second, "old instance dead", func() bool {
		return stateAt(nodes[0], old.LocalName()) == mesh.StateDead && stateAt(nodes[1], old.LocalName()) == mesh.StateDead
	})
	cfg := old.cfg // same name and data dir
	cfg.BindAddr = old.GossipAddr()
	cfg.Meta = &pb.NodeMeta{QuicAddr: old.cfg.Meta.GetQuicAddr(), BootId: ident.NewBootID()}
	n := start(t, cfg)
	up := time.Now()
	testutil.WaitFor(t, 2*time.Second, "restarted node alive with new boot id at the others (2 s budget)", func() bool {
		for _, o := range nodes[:2] {
			m, ok := o.Member(cfg.NodeName)
			if !ok || m.State != mesh.StateAlive || m.BootID != cfg.Meta.GetBootId() {
				return false
			}
		}
		return n.NumAlive() == 3
	})
	t.Logf("restarted node alive at all peers %v after New returned", time.Since(up))
	for _, o := range nodes[:2] {
		testutil.WaitFor(t, time.Second, "EventRestart", func() bool { return o.events.has(mesh.EventRestart, cfg.NodeName) })
	}
}

func TestRestartWithoutSeedsUsesPeersFile(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	waitConverged(t, nodes, 5*time.Second)
	old := nodes[2]
	peers := filepath.Join(old.cfg.DataDir, "peers.json")
	testutil.WaitFor(t, 5*time.Second, "peers.json lists the cluster", func() bool {
		b, err := os.ReadFile(peers)
		return err == nil && strings.Contains(string(b), nodes[0].GossipAddr()) && strings.Contains(string(b), nodes[1].GossipAddr())
	})
	if err := old.Kill(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 3*time.Second, "old instance dead", func() bool { return stateAt(nodes[0], old.LocalName()) == mesh.StateDead })
	cfg := old.cfg
	cfg.Join = nil               // no seeds: only peers.json
	cfg.BindAddr = "127.0.0.1:0" // a new port: the name is reclaimed after DeadNodeReclaimTime
	cfg.Meta = &pb.NodeMeta{QuicAddr: old.cfg.Meta.GetQuicAddr(), BootId: ident.NewBootID()}
	n := start(t, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			dumpNodes(t, []*testNode{nodes[0], nodes[1], n})
			t.Log(n.logs.String())
		}
	})
	waitConverged(t, []*testNode{nodes[0], nodes[1], n}, 5*time.Second)
	if m, _ := nodes[0].Member(cfg.NodeName); m.GossipAddr != n.GossipAddr() {
		t.Errorf("peer sees addr %s, want the new %s", m.GossipAddr, n.GossipAddr())
	}
}

func TestWrongClusterRefused(t *testing.T) {
	nodes := startCluster(t, 2, nil)
	waitConverged(t, nodes, 5*time.Second)

	t.Run("other cluster label", func(t *testing.T) {
		cfg := testConfig(t, "intruder")
		cfg.Cluster = "other"
		cfg.Join = []string{nodes[0].GossipAddr()}
		in := start(t, cfg)
		n, err := in.Join([]string{nodes[0].GossipAddr()})
		if err == nil {
			t.Errorf("Join across clusters succeeded (%d)", n)
		}
		// It says why, not just "EOF".
		if !errors.Is(err, mesh.ErrNoSeedAnswered) || !strings.Contains(err.Error(), `another cluster`) || !strings.Contains(err.Error(), `cluster "other"`) {
			t.Errorf("join error %v does not say the seed may be in another cluster", err)
		}
		if !strings.Contains(in.logs.String(), "another cluster") {
			t.Errorf("the failed join at start was not explained in the log:\n%s", in.logs.String())
		}
		if _, ok := nodes[0].Member("intruder"); ok {
			t.Error("node of another cluster became a member")
		}
		if in.NumAlive() != 1 {
			t.Errorf("intruder sees %d alive", in.NumAlive())
		}
	})
	t.Run("incompatible protocol", func(t *testing.T) {
		cfg := testConfig(t, "future")
		cfg.Meta.ProtocolVersions = []uint32{99}
		cfg.Join = []string{nodes[0].GossipAddr()}
		start(t, cfg)
		testutil.WaitFor(t, 3*time.Second, "refusal logged", func() bool {
			return strings.Contains(nodes[0].logs.String(), "refusing node future: no compatible protocol version")
		})
		if _, ok := nodes[0].Member("future"); ok {
			t.Error("incompatible node became a member")
		}
		if got := strings.Count(nodes[0].logs.String(), "refusing node future"); got != 1 {
			t.Errorf("refusal logged %d times, want once", got)
		}
	})
}

// A node with another gossip key (or none) is refused, and the joining
// node is told why: Join's error is ErrKeyMismatch, and a join at start
// (or by the reconnect loop) logs a WARN that says what to check.
func TestWrongKeyRefused(t *testing.T) {
	nodes := startCluster(t, 1, nil)
	for _, tc := range []struct {
		name string
		key  []byte
	}{
		{"wrong key", []byte("ffffffffffffffffffffffffffffffff")},
		{"no key", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "eve")
			cfg.SecretKey = tc.key
			eve := start(t, cfg)
			_, err := eve.Join([]string{nodes[0].GossipAddr()})
			if !errors.Is(err, mesh.ErrKeyMismatch) || !strings.Contains(err.Error(), "gossip_key_file") {
				t.Fatalf("Join with a wrong key: %v, want ErrKeyMismatch saying what to check", err)
			}
			if _, ok := nodes[0].Member("eve"); ok {
				t.Error("node with a wrong key became a member")
			}
			cfg = testConfig(t, "mallory")
			cfg.SecretKey = tc.key
			cfg.Join = []string{nodes[0].GossipAddr()}
			m := start(t, cfg)
			if logs := m.logs.String(); strings.Count(logs, "gossip_key_file") != 1 || !strings.Contains(logs, "peer_addr="+nodes[0].GossipAddr()) {
				t.Errorf("a join at start with a wrong key logged no warning naming the seed and what to check:\n%s", logs)
			}
		})
	}
}

func TestMetaTooLarge(t *testing.T) {
	cfg := testConfig(t, "big")
	cfg.Meta.QuicAddr = strings.Repeat("x", 600)
	if err := cfg.Validate(); !errors.Is(err, mesh.ErrMetaTooLarge) {
		t.Errorf("Validate: %v, want ErrMetaTooLarge", err)
	}
	if _, err := mesh.New(cfg); !errors.Is(err, mesh.ErrMetaTooLarge) {
		t.Errorf("New: %v, want ErrMetaTooLarge", err)
	}
	n := start(t, testConfig(t, "small"))
	if err := n.UpdateMeta(&pb.NodeMeta{QuicAddr: strings.Repeat("y", 520)}); !errors.Is(err, mesh.ErrMetaTooLarge) {
		t.Errorf("UpdateMeta: %v, want ErrMetaTooLarge", err)
	}
	if err := n.UpdateMeta(&pb.NodeMeta{Cluster: "other"}); !errors.Is(err, mesh.ErrBadConfig) {
		t.Errorf("UpdateMeta other cluster: %v, want ErrBadConfig", err)
	}
}

func TestPartitionHeal(t *testing.T) {
	fn := newFaultNet()
	nodes := startCluster(t, 4, func(i int, cfg *mesh.Config) { cfg.WrapTransport = fn.Wrap })
	waitConverged(t, nodes, 5*time.Second)
	left, right := nodes[:2], nodes[2:]
	addrs := func(ns []*testNode) (out []string) {
		for _, n := range ns {
			out = append(out, n.GossipAddr())
		}
		return out
	}
	fn.Partition(addrs(left), addrs(right))
	testutil.WaitFor(t, 5*time.Second, "each half declares the other dead", func() bool {
		for _, a := range left {
			for _, b := range right {
				if stateAt(a, b.LocalName()) != mesh.StateDead || stateAt(b, a.LocalName()) != mesh.StateDead {
					return false
				}
			}
		}
		return true
	})
	fn.Heal()
	healed := time.Now()
	waitConverged(t, nodes, 10*time.Second) // no Join by hand: the reconnect loop merges
	t.Logf("halves merged %v after heal", time.Since(healed))
	for _, n := range nodes {
		if !n.events.has(mesh.EventAlive, nodes[(slices.Index(nodes, n)+2)%4].LocalName()) {
			t.Errorf("%s: no EventAlive for the other half", n.LocalName())
		}
	}
}

func TestSteadyStateNoFalseSuspicion(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	size, hold := 10, 10*time.Second
	if testing.Short() {
		hold = 3 * time.Second
	}
	if v := os.Getenv("MESH_STEADY"); v != "" { // e.g. MESH_STEADY=2m for the full run
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("MESH_STEADY=%q: %v", v, err)
		}
		hold = d
	}
	begin := time.Now()
	nodes := startCluster(t, size, nil)
	waitConverged(t, nodes, 10*time.Second)
	t.Logf("converged after %v", time.Since(begin))
	// Steady means after convergence: under -race on two cores, starting ten
	// memberlists can starve a probe for a moment, which is not steady state.
	before := make([]int, len(nodes))
	for i, n := range nodes {
		before[i] = n.events.count(mesh.EventSuspect, mesh.EventDead, mesh.EventLeft)
		if before[i] > 0 {
			t.Logf("%s: %d suspicion events during startup (ignored)", n.LocalName(), before[i])
		}
	}
	deadline := time.Now().Add(hold)
	testutil.WaitFor(t, hold+5*time.Second, fmt.Sprintf("steady %v", hold), func() bool {
		for i, n := range nodes {
			if c := n.events.count(mesh.EventSuspect, mesh.EventDead, mesh.EventLeft) - before[i]; c > 0 {
				for _, ev := range n.events.evs {
					t.Logf("%s: %s %s at %v", n.LocalName(), ev.Kind, ev.Member.Name, ev.Member.Since.Sub(begin))
				}
				t.Fatalf("%s saw %d suspect/dead/left events in a steady cluster", n.LocalName(), c)
			}
		}
		return time.Now().After(deadline)
	})
}

func TestValidate(t *testing.T) {
	good := mesh.DefaultConfig("n1")
	if err := good.Validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*mesh.Config)
		want error
	}{
		{"no name", func(c *mesh.Config) { c.NodeName = "" }, mesh.ErrBadConfig},
		{"no cluster", func(c *mesh.Config) { c.Cluster = "" }, mesh.ErrBadConfig},
		{"long cluster", func(c *mesh.Config) { c.Cluster = strings.Repeat("c", 300) }, mesh.ErrBadConfig},
		{"bad bind", func(c *mesh.Config) { c.BindAddr = "localhost" }, mesh.ErrBadConfig},
		{"bind hostname", func(c *mesh.Config) { c.BindAddr = "example.com:1" }, mesh.ErrBadConfig},
		{"bad port", func(c *mesh.Config) { c.BindAddr = "127.0.0.1:99999" }, mesh.ErrBadConfig},
		{"bad advertise", func(c *mesh.Config) { c.AdvertiseAddr = "x" }, mesh.ErrBadConfig},
		{"bad seed", func(c *mesh.Config) { c.Join = []string{"nope"} }, mesh.ErrBadConfig},
		{"short key", func(c *mesh.Config) { c.SecretKey = []byte("short") }, mesh.ErrBadGossipKey},
		{"meta cluster", func(c *mesh.Config) { c.Meta = &pb.NodeMeta{Cluster: "x"} }, mesh.ErrBadConfig},
		{"zero probe", func(c *mesh.Config) { c.ProbeInterval = 0 }, mesh.ErrBadConfig},
		{"probe timeout", func(c *mesh.Config) { c.ProbeTimeout = time.Second }, mesh.ErrBadConfig},
		{"zero leave", func(c *mesh.Config) { c.LeaveTimeout = 0 }, mesh.ErrBadConfig},
		{"reconnect", func(c *mesh.Config) { c.ReconnectTimeout = time.Millisecond }, mesh.ErrBadConfig},
		{"suspicion", func(c *mesh.Config) { c.SuspicionMult = 0 }, mesh.ErrBadConfig},
		{"indirect", func(c *mesh.Config) { c.IndirectChecks = -1 }, mesh.ErrBadConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mesh.DefaultConfig("n1")
			tc.mod(&c)
			if err := c.Validate(); !errors.Is(err, tc.want) {
				t.Errorf("Validate = %v, want %v", err, tc.want)
			}
			if m, err := mesh.New(c); !errors.Is(err, tc.want) {
				if m != nil {
					_ = m.Kill()
				}
				t.Errorf("New = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestSeedDownIsNotFatal(t *testing.T) {
	// A seed that is not up yet: New succeeds, the reconnect loop joins it later.
	seed := testConfig(t, "seed")
	seed.BindAddr = freeAddr(t)
	cfg := testConfig(t, "early")
	cfg.Join = []string{seed.BindAddr}
	early := start(t, cfg)
	if early.NumAlive() != 1 {
		t.Fatalf("NumAlive = %d", early.NumAlive())
	}
	s := start(t, seed)
	waitConverged(t, []*testNode{early, s}, 5*time.Second)
}

// freeAddr returns a loopback address whose port is free for gossip.
func freeAddr(t testing.TB) string {
	t.Helper()
	cfg := testConfig(t, "probe")
	m, err := mesh.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := m.GossipAddr()
	_ = m.Kill()
	return addr
}

// TestTrafficCounted: every member counts the gossip bytes it sends and
// receives (a join is a stream, probes are datagrams), and the counts keep
// growing while the cluster only probes.
func TestTrafficCounted(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	waitConverged(t, nodes, 5*time.Second)
	first := make([]mesh.Traffic, len(nodes))
	for i, n := range nodes {
		first[i] = n.Traffic()
		if first[i].Sent == 0 || first[i].Received == 0 {
			t.Fatalf("%s after joining: %+v", n.LocalName(), first[i])
		}
	}
	for i, n := range nodes {
		testutil.WaitFor(t, 10*time.Second, n.LocalName()+" probing", func() bool {
			tr := n.Traffic()
			return tr.Sent > first[i].Sent && tr.Received > first[i].Received
		})
	}
}

package mesh

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// reprobeCfg: a member on loopback whose own probes and suspicion expiry
// are a minute away, so only re-probes change a Suspect state.
func reprobeCfg(t *testing.T, name string, join []string) Config {
	cfg := DefaultConfig(name)
	cfg.Cluster = "test"
	cfg.BindAddr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Meta = &pb.NodeMeta{QuicAddr: "127.0.0.1:1", BootId: name + "-boot"}
	cfg.Join = join
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.ProbeInterval, cfg.ProbeTimeout = time.Minute, 200*time.Millisecond
	return cfg
}

// reprobeCluster starts a member per name, each joining the first, and
// waits until the first sees the others alive.
func reprobeCluster(t *testing.T, names ...string) []*Mesh {
	var ms []*Mesh
	for _, name := range names {
		var join []string
		if len(ms) > 0 {
			join = []string{ms[0].GossipAddr()}
		}
		m, err := New(reprobeCfg(t, name, join))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Kill() })
		ms = append(ms, m)
	}
	testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%s sees %v alive", names[0], names[1:]), func() bool {
		for _, name := range names[1:] {
			if stateOf(ms[0], name) != StateAlive {
				return false
			}
		}
		return true
	})
	return ms
}

// blackhole is a bound UDP socket that never reads: pings to it vanish
// without an ICMP error.
func blackhole(t *testing.T) string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	return pc.LocalAddr().String()
}

// TestReprobeEndsSuspicion: a member Suspect from our failed probe is
// pinged again after a ProbeInterval and is Alive as soon as it answers;
// one that does not answer stays Suspect. memberlist's own probes and the
// expiry timeout are a minute away here, so only the re-probe can end it.
func TestReprobeEndsSuspicion(t *testing.T) {
	ms := reprobeCluster(t, "a", "b")
	a, b := ms[0], ms[1]
	since := func() time.Time {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.view["b"].Since
	}
	reprobing := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		_, ok := a.reprobing["b"]
		return ok
	}

	a.markSuspect("b")
	if got := stateOf(a, "b"); got != StateSuspect {
		t.Fatalf("after a failed probe: %v", got)
	}
	a.reprobeSuspects(since()) // too young: memberlist records its suspicion just after the log line
	if reprobing() {
		t.Fatal("re-probed a suspicion younger than one ProbeInterval")
	}
	a.reprobeSuspects(since().Add(2 * time.Minute))
	testutil.WaitFor(t, 10*time.Second, "b Alive after answering the re-probe", func() bool { return stateOf(a, "b") == StateAlive })
	testutil.WaitFor(t, 10*time.Second, "re-probe finished", func() bool { return !reprobing() })

	// A member that does not answer stays Suspect.
	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	a.markSuspect("b")
	a.reprobe("b", b.GossipAddr())
	if got := stateOf(a, "b"); got != StateSuspect {
		t.Fatalf("a member that did not answer the re-probe is %v", got)
	}
}

// TestReprobeNeedsTheMember: the ping names the member, so another member
// at the address in the view (a stale one) does not answer for it.
func TestReprobeNeedsTheMember(t *testing.T) {
	ms := reprobeCluster(t, "a", "b", "c")
	a, b, c := ms[0], ms[1], ms[2]
	_ = b.Kill()
	a.mu.Lock()
	mem := a.view["b"]
	mem.GossipAddr = c.GossipAddr()
	a.view["b"] = mem
	a.mu.Unlock()
	a.markSuspect("b")
	a.reprobe("b", c.GossipAddr())
	if got := stateOf(a, "b"); got != StateSuspect {
		t.Fatalf("b made %v by c's address", got)
	}
}

// TestReprobeLeavesDeadAndLeft: a Dead or Left member that would answer
// is not re-probed, nor made Alive by an answer.
func TestReprobeLeavesDeadAndLeft(t *testing.T) {
	ms := reprobeCluster(t, "a", "b")
	a, b := ms[0], ms[1]
	for _, st := range []State{StateDead, StateLeft} {
		a.mu.Lock()
		mem := a.view["b"]
		mem.State, mem.Since = st, time.Now().Add(-time.Hour)
		a.view["b"] = mem
		a.mu.Unlock()
		a.reprobeSuspects(time.Now())
		a.reprobe("b", b.GossipAddr())
		if got := stateOf(a, "b"); got != st {
			t.Fatalf("%v member made %v", st, got)
		}
	}
}

// TestReprobeShutdownRace: re-probes started by the loop's own ticker race
// Kill and Close: no race, no leaked goroutine, no packet sent after
// memberlist's Shutdown.
func TestReprobeShutdownRace(t *testing.T) {
	var late, pings atomic.Int64
	for i := range 6 {
		cfg := reprobeCfg(t, "a", nil)
		cfg.ProbeInterval, cfg.ProbeTimeout = 20*time.Millisecond, 10*time.Millisecond
		cfg.LeaveTimeout = 50 * time.Millisecond
		cfg.WrapTransport = func(tr memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
			return &recTransport{NodeAwareTransport: tr, late: &late, pings: &pings}
		}
		a, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		addr := blackhole(t)
		a.mu.Lock()
		for j := range 20 {
			name := fmt.Sprintf("p%d", j)
			a.setLocked(name, Member{Name: name, GossipAddr: addr, State: StateSuspect, Since: time.Now().Add(-time.Minute)})
		}
		a.mu.Unlock()
		start := pings.Load()
		testutil.WaitFor(t, 5*time.Second, "some re-probes", func() bool { return pings.Load() > start+int64(i%5)*10 })
		var wg sync.WaitGroup
		wg.Go(func() {
			if i%2 == 0 {
				_ = a.Kill()
			} else {
				_ = a.Close()
			}
		})
		wg.Wait()
	}
	if late.Load() > 0 {
		t.Fatalf("%d packets written after Shutdown", late.Load())
	}
}

// recTransport flags any packet written after Shutdown.
type recTransport struct {
	memberlist.NodeAwareTransport
	down  atomic.Bool
	late  *atomic.Int64
	pings *atomic.Int64
}

func (r *recTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if r.down.Load() {
		r.late.Add(1)
	}
	r.pings.Add(1)
	return r.NodeAwareTransport.WriteToAddress(b, a)
}

func (r *recTransport) Shutdown() error {
	r.down.Store(true)
	return r.NodeAwareTransport.Shutdown()
}

package mesh_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/internal/plot"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/mesh"
)

// fleetJoinEvery paces the start of a large cluster in one process: one
// member begins to join every 100 ms. A joiner re-broadcasts every member
// its push/pull taught it, each RetransmitMult x ceil(log10(n+1)) times, so
// a join costs gossip in proportion to the cluster's size. On two cores,
// 200 members started by eight workers, as fast as they could or each
// waiting only until the members it could see caught up, tipped into a
// storm of suspicions in 6 of 6 starts; started about ten a second they
// converged in 9 of 9, within a second of the last start. Devices of a
// real fleet each have their own CPU for the gossip of their joins.
const fleetJoinEvery = 100 * time.Millisecond

// fleetQuiet: how long a started cluster must go without a suspect or dead
// event before its steady hold begins (several suspicion timeouts).
const fleetQuiet = 5 * time.Second

// startFleet starts n members with PresetFor(n): the first alone, then the
// rest one every fleetJoinEvery, each joining the first member and two
// random members already up, so no seed serialises the joins.
func startFleet(tb testing.TB, n int, rep *fleetReport) []*testNode {
	tb.Helper()
	cfgFor := func(i int) mesh.Config {
		name := fmt.Sprintf("n%03d", i)
		base := testConfig(tb, name)
		cfg := mesh.PresetFor(name, n)
		cfg.Cluster, cfg.DataDir, cfg.SecretKey, cfg.Meta = base.Cluster, base.DataDir, base.SecretKey, base.Meta
		return cfg
	}
	nodes := make([]*testNode, n)
	nodes[0] = start(tb, cfgFor(0))
	up := []string{nodes[0].GossipAddr()}
	tick := time.NewTicker(fleetJoinEvery)
	defer tick.Stop()
	for i := 1; i < n; i++ {
		<-tick.C
		cfg := cfgFor(i)
		cfg.Join = []string{up[0], up[rand.IntN(len(up))], up[rand.IntN(len(up))]}
		nodes[i] = start(tb, cfg)
		up = append(up, nodes[i].GossipAddr())
		if i%10 == 0 {
			rep.converging(nodes[:i+1], n)
		}
	}
	return nodes
}

// TestFleet is the large-cluster run: MESH_FLEET=200 starts 200 members in
// one process, waits for convergence, holds a steady cluster for
// MESH_FLEET_STEADY (default 2m) with no suspicion allowed, then kills and
// restarts members to check the detection bounds (dead everywhere <= 3 s,
// alive again everywhere <= 2 s). Run it without -race (the race detector
// caps goroutines and slows memberlist tenfold):
//
//	make fleet   # MESH_FLEET=200 MESH_FLEET_STEADY=2m go test -run TestFleet -v ./mesh/
//
// The normal suite runs TestConverge20 instead.
func TestFleet(t *testing.T) {
	v := os.Getenv("MESH_FLEET")
	if v == "" {
		t.Skip("set MESH_FLEET=200 to run the large-cluster run")
	}
	size, err := strconv.Atoi(v)
	if err != nil || size < 4 {
		t.Fatalf("MESH_FLEET=%q: want a size >= 4", v)
	}
	hold := 2 * time.Minute
	if v := os.Getenv("MESH_FLEET_STEADY"); v != "" {
		if hold, err = time.ParseDuration(v); err != nil {
			t.Fatalf("MESH_FLEET_STEADY=%q: %v", v, err)
		}
	}
	var ms0 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	g0 := runtime.NumGoroutine()
	begin := time.Now()
	rep := &fleetReport{begin: begin}
	defer rep.write(t, size)
	nodes := startFleet(t, size, rep)
	started := time.Since(begin)
	waitFleetConverged(t, nodes, 5*time.Minute, rep)
	t.Logf("%d members: all started in %v, converged (everyone sees %d alive) %v after the first start",
		size, started.Round(time.Millisecond), size, time.Since(begin).Round(time.Millisecond))
	var ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	t.Logf("per member: %.1f goroutines, %.0f KiB live heap (%d goroutines, %d MiB heap in all)",
		float64(runtime.NumGoroutine()-g0)/float64(size), float64(ms1.HeapAlloc-ms0.HeapAlloc)/float64(size)/1024,
		runtime.NumGoroutine(), ms1.HeapAlloc>>20)

	// Steady: no member may suspect another.
	bad := func() int {
		c := 0
		for _, n := range nodes {
			c += n.events.count(mesh.EventSuspect, mesh.EventDead, mesh.EventLeft)
		}
		return c
	}
	// The steady hold begins once the start's suspicions have run their
	// course: no new event for fleetQuiet (at most a minute).
	before, quietSince, waitQuiet := bad(), time.Now(), time.Now()
	testutil.WaitFor(t, time.Minute, fmt.Sprintf("no suspect/dead event for %v after the start", fleetQuiet), func() bool {
		if c := bad(); c != before {
			before, quietSince = c, time.Now()
		}
		return time.Since(quietSince) >= fleetQuiet
	})
	if before > 0 {
		t.Logf("%d suspect/dead events during start-up; quiet for %v after %v",
			before, fleetQuiet, time.Since(waitQuiet).Round(time.Millisecond))
	}
	sent := func() (b uint64) {
		for _, n := range nodes {
			b += n.Traffic().Sent
		}
		return b
	}
	sent0, steadyStart := sent(), time.Now()
	lastSent, lastAt := sent0, steadyStart
	deadline := time.Now().Add(hold)
	testutil.WaitFor(t, hold+time.Minute, fmt.Sprintf("steady %v", hold), func() bool {
		if now := time.Now(); now.Sub(lastAt) >= 5*time.Second {
			b := sent()
			rep.gossip.Points = append(rep.gossip.Points, plot.Point{T: now.Sub(steadyStart).Seconds(),
				V: float64(b-lastSent) / now.Sub(lastAt).Seconds() / float64(size)})
			lastSent, lastAt = b, now
		}
		if c := bad() - before; c > 0 {
			for _, n := range nodes {
				for _, k := range []mesh.EventKind{mesh.EventSuspect, mesh.EventDead} {
					if n.events.count(k) > 0 {
						t.Logf("%s: %d %s events", n.LocalName(), n.events.count(k), k)
					}
				}
			}
			t.Fatalf("%d suspect/dead/left events in a steady %d-member cluster", c, size)
		}
		return time.Now().After(deadline)
	})
	t.Logf("steady %v: no suspicion among %d members; gossip sent %.0f B/s per member",
		hold, size, float64(sent()-sent0)/time.Since(steadyStart).Seconds()/float64(size))

	// Detection: kill a member, time Dead at every survivor; restart it on
	// the same address with a new boot id, time Alive at every member.
	const trials = 5
	var deads, alives []time.Duration
	for i := range trials {
		k := 1 + (i*37)%(size-1)
		victim := nodes[k]
		others := slices.Delete(slices.Clone(nodes), k, k+1)
		killed := time.Now()
		if err := victim.Kill(); err != nil {
			t.Fatal(err)
		}
		death := plot.Series{Name: fmt.Sprintf("trial %d", i+1)}
		testutil.WaitFor(t, 30*time.Second, "dead at every survivor", func() bool {
			seen := 0
			for _, o := range others {
				if stateAt(o, victim.LocalName()) == mesh.StateDead {
					seen++
				}
			}
			death.Points = append(death.Points, plot.Point{T: time.Since(killed).Seconds(), V: float64(seen)})
			return seen == len(others)
		})
		rep.deaths = append(rep.deaths, death)
		deads = append(deads, time.Since(killed))
		cfg := victim.cfg
		cfg.BindAddr = victim.GossipAddr()
		cfg.Meta = &pb.NodeMeta{QuicAddr: victim.cfg.Meta.GetQuicAddr(), BootId: ident.NewBootID()}
		cfg.Join = []string{nodes[0].GossipAddr()}
		up := time.Now()
		n := start(t, cfg)
		logged := false
		back := plot.Series{Name: fmt.Sprintf("trial %d", i+1)}
		testutil.WaitFor(t, 30*time.Second, "alive at every member", func() bool {
			seen := 0
			for _, o := range others {
				m, ok := o.Member(cfg.NodeName)
				if ok && m.State == mesh.StateAlive && m.BootID == cfg.Meta.GetBootId() {
					seen++
				} else if !logged && time.Since(up) > 2*time.Second {
					logged = true
					t.Logf("after 2 s %s sees %s as %s boot %s (new boot %s)", o.LocalName(), cfg.NodeName, m.State, m.BootID, cfg.Meta.GetBootId())
				}
			}
			back.Points = append(back.Points, plot.Point{T: time.Since(up).Seconds(), V: float64(seen)})
			return seen == len(others)
		})
		rep.restarts = append(rep.restarts, back)
		alives = append(alives, time.Since(up))
		nodes[k] = n
	}
	slices.Sort(deads)
	slices.Sort(alives)
	t.Logf("kill -> dead at all %d survivors: %v (median %v)", size-1, roundAll(deads), deads[trials/2].Round(time.Millisecond))
	t.Logf("restart -> alive at all %d members: %v (median %v)", size-1, roundAll(alives), alives[trials/2].Round(time.Millisecond))
	if deads[trials-1] > 3*time.Second {
		t.Errorf("slowest death took %v to reach everyone, bound 3 s", deads[trials-1])
	}
	if alives[trials-1] > 2*time.Second {
		t.Errorf("slowest restart took %v to be alive everywhere, bound 2 s", alives[trials-1])
	}
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// waitFleetConverged is waitConverged with a progress line every 10 s (how
// many members see everyone, the fewest alive any member sees, suspicion
// so far) and, on a timeout, the last log lines of the member that sees
// the fewest.
func waitFleetConverged(tb testing.TB, nodes []*testNode, timeout time.Duration, rep *fleetReport) {
	tb.Helper()
	lowest := func() (done, fewest int, who *testNode) {
		fewest = len(nodes) + 1
		for _, n := range nodes {
			a := n.NumAlive()
			if a == len(nodes) {
				done++
			}
			if a < fewest {
				fewest, who = a, n
			}
		}
		return done, fewest, who
	}
	start, last := time.Now(), time.Now()
	for {
		done, fewest, who := lowest()
		rep.add(len(nodes), done, fewest)
		if done == len(nodes) {
			return
		}
		if time.Since(last) >= 10*time.Second {
			last = time.Now()
			ev := 0
			for _, n := range nodes {
				ev += n.events.count(mesh.EventSuspect, mesh.EventDead)
			}
			tb.Logf("converging %v: %d of %d see everyone; fewest seen alive %d (%s); %d suspect/dead events so far",
				time.Since(start).Round(time.Second), done, len(nodes), fewest, who.LocalName(), ev)
		}
		if time.Since(start) > timeout {
			logs := who.logs.String()
			if len(logs) > 4000 {
				logs = logs[len(logs)-4000:]
			}
			tb.Fatalf("not converged after %v: %d of %d see everyone; %s sees %d alive; its last log lines:\n%s",
				timeout, done, len(nodes), who.LocalName(), fewest, logs)
		}
		time.Sleep(100 * time.Millisecond) // polling the members' own view
	}
}

// fleetReport holds the curves TestFleet draws into fleet-members-N.svg
// when MESH_REPORT_DIR names a directory (make fleet: docs/).
type fleetReport struct {
	begin                     time.Time
	started, everyone, fewest plot.Series // by seconds since the first start
	gossip                    plot.Series // B/s per member, by seconds of the steady hold
	deaths, restarts          []plot.Series
}

// converging samples the members started so far (of n in all).
func (r *fleetReport) converging(up []*testNode, n int) {
	done, fewest := 0, n+1
	for _, u := range up {
		a := u.NumAlive()
		if a == n {
			done++
		}
		fewest = min(fewest, a)
	}
	r.add(len(up), done, fewest)
}

func (r *fleetReport) add(started, everyone, fewest int) {
	t := time.Since(r.begin).Seconds()
	r.started.Points = append(r.started.Points, plot.Point{T: t, V: float64(started)})
	r.everyone.Points = append(r.everyone.Points, plot.Point{T: t, V: float64(everyone)})
	r.fewest.Points = append(r.fewest.Points, plot.Point{T: t, V: float64(fewest)})
}

func (r *fleetReport) write(tb testing.TB, size int) {
	dir := os.Getenv("MESH_REPORT_DIR")
	if dir == "" {
		return
	}
	r.started.Name, r.everyone.Name, r.fewest.Name = "members started", "members that see all alive", "fewest alive any member sees"
	r.gossip.Name = "gossip sent per member"
	charts := []plot.Chart{
		{Title: fmt.Sprintf("Paced start of %d members (seconds since the first start)", size), YLabel: "members", Series: []plot.Series{r.started, r.everyone, r.fewest}},
		{Title: "Steady hold: gossip sent per member (seconds into the hold)", YLabel: "bytes/s", Series: []plot.Series{r.gossip}},
		{Title: "A member killed: survivors that see it dead (seconds since the kill)", YLabel: "members", Series: r.deaths},
		{Title: "Restarted with a new boot id: members that see it alive (seconds since the restart)", YLabel: "members", Series: r.restarts},
	}
	writeReport(tb, filepath.Join(dir, fmt.Sprintf("fleet-members-%d.svg", size)),
		fmt.Sprintf("make fleet: %d gossip members in one process, %s", size, time.Now().Format("2006-01-02")), charts)
}

// writeReport writes charts as an SVG file at path.
func writeReport(tb testing.TB, path, title string, charts []plot.Chart) {
	tb.Helper()
	if err := plot.WriteFile(path, title, charts); err != nil {
		tb.Errorf("report: %v", err)
		return
	}
	tb.Logf("report: %s", path)
}

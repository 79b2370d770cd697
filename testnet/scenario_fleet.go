package testnet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/internal/plot"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The fleet scenario: a few collectors and many devices, every device
// sending telemetry to one collector and every collector sending commands
// to its devices, all with TellReliable, while a fifth of the devices go
// offline in waves and one link in a hundred is cut. Its report draws
// delivery latency percentiles, outbox depth, AIMD limits and open
// connections per node over time.

const (
	fleetCollectors = 3    // nodes 0..2; the rest are devices
	fleetOffline    = 0.20 // share of devices that go offline, in two waves
	fleetCutLinks   = 0.01 // share of node pairs whose link is cut
	fleetCommands   = 3    // commands each device receives
)

// fleetOptions gives the nodes of a fleet larger than paceAbove the
// membership timers of the 1,024-member preset (probe every 1 s, timeout
// 500 ms, gossip every 100 ms, push/pull every 30 s) instead of the ones a
// cluster of their size ships with (250 ms, 150 ms, 50 ms, 10 s). The
// scenario's devices share this process's cores, a hundredth of two cores
// each at 200 where a device has its own, so a device waiting for a core
// answers probes late; with the shipped timers each probe that times out
// starts a suspicion and a refutation that all 200 members relay, and a
// wave of restarts tipped the process into a storm of them it did not
// leave. The shipped timers' detection bounds at 200 members are measured
// without the rest of the node, by the mesh package's fleet test.
func fleetOptions(size Size) []Option {
	if size.Nodes <= paceAbove {
		return nil
	}
	relaxed := node.MeshPreset(1024)
	return []Option{WithConfig(func(_ int, cfg *node.Config) {
		cfg.Mesh.ProbeInterval, cfg.Mesh.ProbeTimeout = relaxed.ProbeInterval, relaxed.ProbeTimeout
		cfg.Mesh.GossipInterval, cfg.Mesh.PushPullInterval = relaxed.GossipInterval, relaxed.PushPullInterval
	})}
}

// fleetSizes: 200 nodes at the large size; 12 in the test suite.
var (
	fleetLarge = Size{Nodes: 200, Workers: 197, Messages: 60000}
	fleetSmall = Size{Nodes: 12, Workers: 9, Messages: 360}
)

// latencies collects delivery latencies (send call to handler run) in
// one-second buckets since the scenario started.
type latencies struct {
	mu      sync.Mutex        // guards the fields below
	next    map[string]uint64 // per sender>recipient: the sequence SendReliable gives next
	sentAt  map[string]time.Time
	buckets map[int][]time.Duration
}

// sent notes the time of the next send of sender to recipient. Like the
// Recorder, it numbers each pair's sends from 1, so the two agree as long
// as every send of the pair goes through here.
func (l *latencies) sent(sender, recipient string, at time.Time) {
	l.mu.Lock()
	k := sender + ">" + recipient
	l.next[k]++
	l.sentAt[fmt.Sprintf("%s#%d", k, l.next[k])] = at
	l.mu.Unlock()
}

// ran records the first run of id; later runs of it count nothing.
func (l *latencies) ran(id string, start, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.sentAt[id]
	if !ok {
		return
	}
	delete(l.sentAt, id)
	b := int(now.Sub(start) / time.Second)
	l.buckets[b] = append(l.buckets[b], now.Sub(at))
}

// series returns p50, p99 and max per bucket, in seconds, and the
// percentiles over the whole run.
func (l *latencies) series() (p50, p99, top plot.Series, all50, all99 time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p50, p99, top = plot.Series{Name: "p50"}, plot.Series{Name: "p99"}, plot.Series{Name: "max"}
	var all []time.Duration
	for _, b := range slices.Sorted(func(yield func(int) bool) {
		for k := range l.buckets {
			if !yield(k) {
				return
			}
		}
	}) {
		d := l.buckets[b]
		slices.Sort(d)
		all = append(all, d...)
		t := float64(b) + 0.5
		p50.Points = append(p50.Points, plot.Point{T: t, V: pct(d, 50).Seconds()})
		p99.Points = append(p99.Points, plot.Point{T: t, V: pct(d, 99).Seconds()})
		top.Points = append(top.Points, plot.Point{T: t, V: d[len(d)-1].Seconds()})
	}
	slices.Sort(all)
	return p50, p99, top, pct(all, 50), pct(all, 99)
}

func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

// fleetSample is what the fleet's own sampler sees every second.
type fleetSample struct {
	at                     time.Duration
	depth                  int     // messages waiting in every running node's outbox
	limMin, limMed, limMax float64 // AIMD limits over every (sender, peer) with a limiter
	connMean, connMax      float64 // open connections per running node
	running                int
	gossipSent             uint64 // gossip bytes every running node sent since it started
	goroutines             int    // in the whole process
	heap                   uint64 // Go heap in use in the whole process, bytes
	rssAnon                uint64 // anonymous resident memory of the process, bytes (0 where /proc is missing)
}

func fleet(ctx context.Context, s *stage) error {
	n := s.size.Nodes
	if n < fleetCollectors+2 {
		return fmt.Errorf("%w: the fleet needs at least %d nodes", ErrBadSize, fleetCollectors+2)
	}
	devices := make([]int, 0, n-fleetCollectors)
	for i := fleetCollectors; i < n; i++ {
		devices = append(devices, i)
	}
	collectorOf := func(d int) int { return d % fleetCollectors }
	rec := NewRecorder(7)
	lat := &latencies{next: map[string]uint64{}, sentAt: map[string]time.Time{}, buckets: map[int][]time.Duration{}}
	if err := s.setSpawn(func(i int, nd *node.Node) error {
		actor := "commands"
		if i < fleetCollectors {
			actor = "telemetry"
		}
		h := RecordingHandler(rec, nd, NoBug)
		_, err := nd.Spawn(actor, func(ctx context.Context, m *node.Message) (proto.Message, error) {
			r, err := h(ctx, m)
			if err == nil {
				var v wrapperspb.UInt64Value
				if m.Decode(&v) == nil {
					lat.ran(fmt.Sprintf("%s>%s#%d", m.Sender().Node, m.Recipient(), v.GetValue()), s.start, time.Now())
				}
				s.processed.Add(1)
			}
			return r, err
		})
		return err
	}); err != nil {
		return err
	}
	s.setObserve(collectors(fleetCollectors)...) // the summary's AIMD limits and depth
	rng := rand.New(rand.NewPCG(11, uint64(n)))

	// The run lasts long enough to send every device's telemetry at a
	// steady pace: 60 s at the large size, a few seconds in the tests.
	run := 4 * time.Second
	if n >= 50 {
		run = 60 * time.Second
	}
	perDevice := max(1, s.size.Messages/len(devices))
	every := run / time.Duration(perDevice)

	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		errs  []error
	)
	fail := func(err error) {
		errMu.Lock()
		errs = append(errs, err)
		errMu.Unlock()
	}
	send := func(from int, to node.Address) {
		nd := s.c.Node(from)
		if nd == nil {
			return
		}
		lat.sent(nd.Name(), to.String(), time.Now())
		if _, err := SendReliable(ctx, rec, nd, to); err != nil && s.c.Node(from) == nd {
			fail(fmt.Errorf("%s -> %s: %w", nd.Name(), to, err)) // not a device going offline under the call
		}
	}

	// Telemetry: each device sends perDevice messages, paced, while it runs.
	for _, d := range devices {
		to := s.c.Addr("telemetry", collectorOf(d))
		wg.Go(func() {
			t := time.NewTicker(every)
			defer t.Stop()
			for sent := 0; sent < perDevice; {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if s.c.Node(d) == nil {
					continue // offline: the device sends when it is back
				}
				send(d, to)
				sent++
			}
		})
	}
	// Commands: fleetCommands rounds from each collector to its devices,
	// one goroutine per collector, rounds one after another, so each pair's
	// order is the send order.
	commands := func(round int) {
		s.mark(fmt.Sprintf("commands: round %d", round))
		var cw sync.WaitGroup
		for c := range fleetCollectors {
			cw.Go(func() {
				for _, d := range devices {
					if collectorOf(d) == c {
						send(c, s.c.Addr("commands", d))
					}
				}
			})
		}
		cw.Wait()
	}

	// The fleet's own sampler: every second, over every running node.
	var smu sync.Mutex
	var fs []fleetSample
	sctx, stopSampler := context.WithCancel(ctx)
	var sw sync.WaitGroup
	sw.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			smp := sampleFleet(s)
			smu.Lock()
			fs = append(fs, smp)
			smu.Unlock()
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	})

	// Faults, on a timeline relative to the run.
	offline := slices.Clone(devices)
	rng.Shuffle(len(offline), func(i, j int) { offline[i], offline[j] = offline[j], offline[i] })
	offline = offline[:max(2, int(float64(len(devices))*fleetOffline))]
	waves := [][]int{offline[:len(offline)/2], offline[len(offline)/2:]}
	// The first cut is between a device that stays online and its
	// collector, so some telemetry and commands always wait for the heal.
	stays := slices.DeleteFunc(slices.Clone(devices), func(d int) bool { return slices.Contains(offline, d) })
	cut := [][2]int{{collectorOf(stays[0]), stays[0]}}
	pairs := n * (n - 1) / 2
	for len(cut) < max(1, int(float64(pairs)*fleetCutLinks)) {
		a, b := rng.IntN(n), rng.IntN(n)
		if a != b {
			cut = append(cut, [2]int{min(a, b), max(a, b)})
		}
	}
	at := func(frac float64) bool {
		t := time.NewTimer(time.Until(s.start.Add(time.Duration(frac * float64(run)))))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	kill := func(w []int) error {
		for _, i := range w {
			if err := s.c.Kill(i); err != nil {
				return err
			}
		}
		s.mark(fmt.Sprintf("devices offline: %d", len(w)))
		s.count("devices taken offline", int64(len(w)))
		return nil
	}
	restart := func(w []int) error {
		// Devices come back one every joinEvery, not in one instant: each
		// join's gossip grows with the cluster, and all of them share
		// this process's cores (see joinEvery).
		tick := time.NewTicker(joinEvery)
		defer tick.Stop()
		for k, i := range w {
			if k > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-tick.C:
				}
			}
			if err := s.c.Restart(i); err != nil {
				return err
			}
		}
		s.mark(fmt.Sprintf("devices back: %d", len(w)))
		return nil
	}
	steps := []struct {
		at float64
		do func() error
	}{
		{0.10, func() error {
			for _, p := range cut {
				s.c.Cut(p[0], p[1])
			}
			s.mark(fmt.Sprintf("links cut: %d", len(cut)))
			s.count("links cut", int64(len(cut)))
			return nil
		}},
		{0.15, func() error { return kill(waves[0]) }},
		{0.25, func() error { commands(1); return nil }},
		{0.40, func() error { return restart(waves[0]) }},
		{0.45, func() error { return kill(waves[1]) }},
		{0.55, func() error { commands(2); return nil }},
		{0.70, func() error { return restart(waves[1]) }},
		{0.75, func() error { commands(3); return nil }},
		{0.85, func() error { s.c.Heal(); s.mark("links healed"); return nil }},
	}
	var stepErr error
	for _, st := range steps {
		if !at(st.at) {
			break
		}
		if err := st.do(); err != nil {
			stepErr = err
			break
		}
	}
	wg.Wait()
	if stepErr == nil {
		stepErr = ctx.Err()
	}
	if stepErr == nil {
		s.progress("sends done; waiting for every node to see every other alive")
		stepErr = s.c.WaitConverged(20*time.Second + time.Duration(n)*100*time.Millisecond)
	}
	if stepErr == nil {
		s.progress("converged; waiting for every outbox to drain")
		stepErr = s.c.WaitDrained(drainTimeout(s.size))
	}
	stopSampler()
	sw.Wait()
	if stepErr != nil {
		return stepErr
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	rep, err := s.c.Check(rec)
	if err != nil {
		return err
	}
	s.res.Report = &rep
	s.res.Sent = rep.Sent
	s.count("delivered directly", int64(rep.Delivered))
	s.count("queued", int64(rep.Queued))
	s.check("nothing lost, no duplicates, in order", rep.OK())

	p50, p99, top, all50, all99 := lat.series()
	s.count("latency p50 ms", all50.Milliseconds())
	s.count("latency p99 ms", all99.Milliseconds())
	smu.Lock()
	defer smu.Unlock()
	var depth, lmin, lmed, lmax, cmean, cmax plot.Series
	depth.Name, lmin.Name, lmed.Name, lmax.Name, cmean.Name, cmax.Name = "all outboxes", "min", "median", "max", "mean", "max"
	peakConns := 0.0
	for _, f := range fs {
		t := f.at.Seconds()
		depth.Points = append(depth.Points, plot.Point{T: t, V: float64(f.depth)})
		lmin.Points = append(lmin.Points, plot.Point{T: t, V: f.limMin})
		lmed.Points = append(lmed.Points, plot.Point{T: t, V: f.limMed})
		lmax.Points = append(lmax.Points, plot.Point{T: t, V: f.limMax})
		cmean.Points = append(cmean.Points, plot.Point{T: t, V: f.connMean})
		cmax.Points = append(cmax.Points, plot.Point{T: t, V: f.connMax})
		peakConns = max(peakConns, f.connMax)
	}
	s.count("connections per node, peak", int64(peakConns))
	pn, gossip := fleetPerNode(fs)
	s.count("goroutines per node (median)", int64(pn.goroutines))
	s.count("heap KiB per node (median)", int64(pn.heapKiB))
	s.count("anonymous RSS KiB per node (median)", int64(pn.rssKiB))
	s.count("gossip sent B/s per node (median)", int64(pn.gossipBps))
	s.setCharts([]plot.Chart{
		{Title: "Delivery latency, send call to handler run (by second of the run)", YLabel: "seconds", Series: []plot.Series{p50, p99, top}},
		{Title: "Outbox depth (every node)", YLabel: "messages", Series: []plot.Series{depth}},
		{Title: "AIMD limits over every sender>peer", YLabel: "limit", Series: []plot.Series{lmin, lmed, lmax}},
		{Title: "Open connections per node", YLabel: "connections", Series: []plot.Series{cmean, cmax}},
		{Title: "Gossip sent per node", YLabel: "bytes/s", Series: []plot.Series{gossip}},
	})
	return nil
}

func collectors(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// sampleFleet looks at every running node once.
func sampleFleet(s *stage) fleetSample {
	f := fleetSample{at: time.Since(s.start)}
	var limits, conns []float64
	for _, i := range s.c.Running() {
		nd := s.c.Node(i)
		if nd == nil {
			continue
		}
		f.running++
		st := nd.Outbox().Stats()
		f.depth += st.Depth
		for _, l := range st.LimitByPeer {
			limits = append(limits, float64(l))
		}
		f.gossipSent += nd.Stats().Gossip.Sent
		c := 0
		for _, p := range nd.PeerStats() {
			if p.Connected {
				c++
			}
		}
		conns = append(conns, float64(c))
	}
	if len(limits) > 0 {
		slices.Sort(limits)
		f.limMin, f.limMed, f.limMax = limits[0], limits[len(limits)/2], limits[len(limits)-1]
	}
	for _, c := range conns {
		f.connMean += c / float64(len(conns))
		f.connMax = max(f.connMax, c)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f.goroutines, f.heap, f.rssAnon = runtime.NumGoroutine(), ms.HeapInuse, rssAnon()
	return f
}

// perNode is what the fleet costs per running node: the medians over the
// samples of the process's goroutines, Go heap and anonymous RSS divided
// by the nodes running, and of the gossip each node sent per second
// between two samples (a restarted node's counter starts again at 0, so a
// sample whose total fell is left out).
type perNode struct {
	goroutines, heapKiB, rssKiB, gossipBps float64
}

func fleetPerNode(fs []fleetSample) (perNode, plot.Series) {
	var g, h, r, b []float64
	gossip := plot.Series{Name: "mean per node"}
	for i, f := range fs {
		if f.running == 0 {
			continue
		}
		n := float64(f.running)
		g, h = append(g, float64(f.goroutines)/n), append(h, float64(f.heap)/1024/n)
		if f.rssAnon > 0 {
			r = append(r, float64(f.rssAnon)/1024/n)
		}
		if i > 0 && f.gossipSent >= fs[i-1].gossipSent && f.at > fs[i-1].at {
			bps := float64(f.gossipSent-fs[i-1].gossipSent) / (f.at - fs[i-1].at).Seconds() / n
			b = append(b, bps)
			gossip.Points = append(gossip.Points, plot.Point{T: f.at.Seconds(), V: bps})
		}
	}
	med := func(v []float64) float64 {
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return perNode{goroutines: med(g), heapKiB: med(h), rssKiB: med(r), gossipBps: med(b)}, gossip
}

// rssAnon reads this process's anonymous resident memory from
// /proc/self/status; 0 where it cannot.
func rssAnon() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}

package testnet

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/internal/plot"
	"github.com/meshnode/meshnode/node"
)

// Size scales a scenario.
type Size struct {
	Nodes    int // nodes in the cluster (>= 2)
	Workers  int // simulated workers (actors spread over the nodes)
	Messages int // messages the scenario sends in all
}

// SmallSize is the size the test suite runs.
func SmallSize() Size { return Size{Nodes: 3, Workers: 12, Messages: 240} }

// LargeSize is the size for people (meshnode testnet run NAME).
func LargeSize() Size { return Size{Nodes: 5, Workers: 1000, Messages: 100000} }

func (s Size) validate() error {
	if s.Nodes < 2 || s.Workers < 1 || s.Messages < 1 {
		return fmt.Errorf("%w: %+v (need Nodes >= 2, Workers >= 1, Messages >= 1)", ErrBadSize, s)
	}
	return nil
}

// Sample is one observation of the senders, taken every SampleEvery.
type Sample struct {
	At          time.Duration  // since the scenario started
	Depth       int            // messages waiting in the observed senders' outboxes
	LimitByPeer map[string]int // AIMD limit per "sender>peer"
	Processed   int64          // handler runs so far, all scenario actors
}

// Event is a fault or recovery during a scenario (a node killed, a
// partition healed), marked on the report's time axis.
type Event struct {
	At    time.Duration // since the scenario started
	Label string
}

// SampleEvery is the sampling period of scenario reports.
const SampleEvery = 100 * time.Millisecond

// Result is what a scenario did.
type Result struct {
	Name      string
	Size      Size
	Duration  time.Duration
	Sent      int              // logical messages sent
	Processed int64            // handler runs
	Counts    map[string]int64 // scenario-specific counts (accepted, rejected, fast path, fallback, coalesced, ...)
	Checks    map[string]bool  // scenario-specific claims and whether they held
	Samples   []Sample         // over time
	Events    []Event          // faults and recoveries, in order
	Report    *Report          // invariant report, for scenarios that record every message
	SVG       []byte           // the report: AIMD limit, outbox depth, delivery rate over time
}

// OK reports whether every check of the scenario held.
func (r Result) OK() bool {
	for _, ok := range r.Checks {
		if !ok {
			return false
		}
	}
	return r.Report == nil || r.Report.OK()
}

// WriteSVG writes the report to dir/<name>.svg and returns the path.
func (r Result) WriteSVG(dir string) (string, error) {
	p := filepath.Join(dir, r.Name+".svg")
	if err := os.WriteFile(p, r.SVG, 0o644); err != nil {
		return "", fmt.Errorf("testnet: write report: %w", err)
	}
	return p, nil
}

// scenario runs on a started cluster; it fills res and uses sc to sample.
type scenario struct {
	doc          string
	run          func(ctx context.Context, sc *stage) error
	small, large *Size               // nil: SmallSize and LargeSize
	options      func(Size) []Option // cluster options beyond the defaults (nil: none)
}

var scenarios = map[string]scenario{
	"thundering-herd":      {doc: "workers queue requests while cut from the leader, then all hit its small mailbox at once", run: thunderingHerd},
	"wave-deployment":      {doc: "the fleet is updated in waves through config servers with mailbox capacity 2", run: waveDeployment},
	"heartbeat-coalescing": {doc: "a fast heartbeat sender, a slow receiver: only the newest heartbeat per worker waits", run: heartbeatCoalescing},
	"telemetry-fallback":   {doc: "ask first, outbox on failure, to a collector at capacity half of the time", run: telemetryFallback},
	"offline-delivery":     {doc: "workers go offline mid-deployment and the sender restarts; every message arrives once, in order", run: offlineDelivery},
	"fleet":                {doc: "200 nodes: devices send telemetry to 3 collectors and get commands, a fifth go offline in waves, 1 % of links cut", run: fleet, small: &fleetSmall, large: &fleetLarge, options: fleetOptions},
}

// SmallSizeOf is the size the test suite runs scenario name at.
func SmallSizeOf(name string) Size {
	if sc, ok := scenarios[name]; ok && sc.small != nil {
		return *sc.small
	}
	return SmallSize()
}

// LargeSizeOf is the size for people of scenario name.
func LargeSizeOf(name string) Size {
	if sc, ok := scenarios[name]; ok && sc.large != nil {
		return *sc.large
	}
	return LargeSize()
}

// Scenarios lists the scenario names with a one-line description each.
func Scenarios() map[string]string {
	out := make(map[string]string, len(scenarios))
	for k, s := range scenarios {
		out[k] = s.doc
	}
	return out
}

// ScenarioNames returns the scenario names, sorted.
func ScenarioNames() []string { return slices.Sorted(maps.Keys(scenarios)) }

// stage is what a running scenario works with.
type stage struct {
	c         *Cluster
	name      string
	size      Size
	res       *Result
	processed atomic.Int64
	start     time.Time
	out       io.Writer  // progress lines; nil for none
	outMu     sync.Mutex // one progress line at a time

	// mu guards the fields below.
	mu      sync.Mutex
	samples []Sample
	events  []Event
	observe []int                           // sender nodes whose outbox is sampled
	spawner func(i int, n *node.Node) error // actors of the scenario, (re)spawned on every start
	charts  []plot.Chart                    // the scenario's own panels, drawn above the delivery rate
}

// setCharts replaces the report's AIMD and depth panels with the
// scenario's own.
func (s *stage) setCharts(c []plot.Chart) {
	s.mu.Lock()
	s.charts = c
	s.mu.Unlock()
}

func (s *stage) setObserve(idx ...int) {
	s.mu.Lock()
	s.observe = idx
	s.mu.Unlock()
}

func (s *stage) observed() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.observe
}

// setSpawn installs the scenario's actors and spawns them on the running
// nodes for which f spawns anything.
func (s *stage) setSpawn(f func(i int, n *node.Node) error) error {
	s.mu.Lock()
	s.spawner = f
	s.mu.Unlock()
	for _, i := range s.c.Running() {
		if nd := s.c.Node(i); nd != nil {
			if err := f(i, nd); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *stage) spawn(i int, n *node.Node) error {
	s.mu.Lock()
	f := s.spawner
	s.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(i, n)
}

// mark records an event for the report's time axis.
func (s *stage) mark(label string) {
	s.mu.Lock()
	s.events = append(s.events, Event{At: time.Since(s.start), Label: label})
	s.mu.Unlock()
	s.progress("%s", label)
}

// progress prints one line of what the run is doing now, so that a run of
// minutes is not silent until its summary.
func (s *stage) progress(format string, args ...any) {
	if s.out == nil {
		return
	}
	s.outMu.Lock()
	defer s.outMu.Unlock()
	fmt.Fprintf(s.out, "%s %7.1fs  %s\n", s.name, time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

func (s *stage) count(k string, d int64) {
	s.mu.Lock()
	s.res.Counts[k] += d
	s.mu.Unlock()
}

func (s *stage) check(k string, ok bool) {
	s.mu.Lock()
	s.res.Checks[k] = ok
	s.mu.Unlock()
}

func (s *stage) sample() {
	smp := Sample{At: time.Since(s.start), LimitByPeer: map[string]int{}, Processed: s.processed.Load()}
	for _, i := range s.observed() {
		nd := s.c.Node(i)
		if nd == nil {
			continue
		}
		st := nd.Outbox().Stats()
		smp.Depth += st.Depth
		for p, l := range st.LimitByPeer {
			smp.LimitByPeer[nd.Name()+">"+p] = l
		}
	}
	s.mu.Lock()
	s.samples = append(s.samples, smp)
	s.mu.Unlock()
}

// RunScenario runs the named scenario at size on a new in-process cluster,
// prints a line to out as each step of the run begins (out may be nil) and
// a summary table at the end, and returns the result with its SVG report.
func RunScenario(ctx context.Context, name string, size Size, out io.Writer) (Result, error) {
	sc, ok := scenarios[name]
	if !ok {
		return Result{}, fmt.Errorf("%w: %q (have %v)", ErrUnknownScenario, name, ScenarioNames())
	}
	if err := size.validate(); err != nil {
		return Result{}, err
	}
	res := Result{Name: name, Size: size, Counts: map[string]int64{}, Checks: map[string]bool{}}
	st := &stage{name: name, size: size, res: &res, out: out, start: time.Now()}
	st.progress("starting %d nodes", size.Nodes)
	opts := []Option{WithSpawn(st.spawn), WithConvergeTimeout(20*time.Second + time.Duration(size.Nodes)*300*time.Millisecond)}
	if sc.options != nil {
		opts = append(opts, sc.options(size)...)
	}
	c, err := Start(ctx, size.Nodes, opts...)
	if err != nil {
		return Result{}, fmt.Errorf("testnet: scenario %s: %w", name, err)
	}
	defer func() { _ = c.Close() }()
	st.c = c
	st.progress("%d nodes up and converged; the scenario starts (its clock restarts at 0)", size.Nodes)
	st.start = time.Now()
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(SampleEvery)
		defer t.Stop()
		for {
			st.sample()
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	})
	runErr := sc.run(sctx, st)
	stop()
	wg.Wait()
	st.sample()
	res.Duration = time.Since(st.start)
	res.Processed = st.processed.Load()
	res.Samples = st.samples
	res.Events = st.events
	if runErr != nil {
		return res, fmt.Errorf("testnet: scenario %s: %w", name, runErr)
	}
	res.SVG = render(res, st.charts)
	summary(out, res)
	return res, nil
}

// render draws the three plots, or the scenario's own panels and the
// delivery rate.
func render(res Result, own []plot.Chart) []byte {
	limits := map[string]*plot.Series{}
	depth := plot.Series{Name: "outbox depth"}
	rate := plot.Series{Name: "delivered msgs/s"}
	var prev *Sample
	for k := range res.Samples {
		s := &res.Samples[k]
		t := s.At.Seconds()
		for p, l := range s.LimitByPeer {
			if limits[p] == nil {
				limits[p] = &plot.Series{Name: p}
			}
			limits[p].Points = append(limits[p].Points, plot.Point{T: t, V: float64(l)})
		}
		depth.Points = append(depth.Points, plot.Point{T: t, V: float64(s.Depth)})
		if prev != nil && s.At > prev.At {
			r := float64(s.Processed-prev.Processed) / (s.At - prev.At).Seconds()
			rate.Points = append(rate.Points, plot.Point{T: t, V: r})
		}
		prev = s
	}
	var ls []plot.Series
	for _, k := range slices.Sorted(maps.Keys(limits)) {
		ls = append(ls, *limits[k])
	}
	var marks []plot.Mark
	for _, e := range res.Events {
		marks = append(marks, plot.Mark{T: e.At.Seconds(), Label: e.Label})
	}
	charts := []plot.Chart{
		{Title: "AIMD limit per peer (sender>peer)", YLabel: "limit", Series: ls},
		{Title: "Outbox depth (senders)", YLabel: "messages", Series: []plot.Series{depth}},
	}
	if own != nil {
		charts = slices.Clone(own)
	}
	charts = append(charts, plot.Chart{Title: "Delivery rate", YLabel: "msgs/s", Series: []plot.Series{rate}})
	for i := range charts {
		charts[i].Marks = marks
	}
	var b bytesBuffer
	_ = plot.SVG(&b, fmt.Sprintf("%s — %d nodes, %d workers, %d messages", res.Name, res.Size.Nodes, res.Size.Workers, res.Size.Messages), charts)
	return b.b
}

type bytesBuffer struct{ b []byte }

func (w *bytesBuffer) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

// summary prints the result as a table.
func summary(out io.Writer, res Result) {
	if out == nil {
		return
	}
	minL, maxL, maxDepth := 0, 0, 0
	for _, s := range res.Samples {
		for _, l := range s.LimitByPeer {
			if minL == 0 || l < minL {
				minL = l
			}
			maxL = max(maxL, l)
		}
		maxDepth = max(maxDepth, s.Depth)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\t%s\n", res.Name)
	fmt.Fprintf(tw, "size\t%d nodes, %d workers, %d messages\n", res.Size.Nodes, res.Size.Workers, res.Size.Messages)
	fmt.Fprintf(tw, "duration\t%v\n", res.Duration.Round(time.Millisecond))
	fmt.Fprintf(tw, "sent\t%d\n", res.Sent)
	fmt.Fprintf(tw, "handler runs\t%d\n", res.Processed)
	fmt.Fprintf(tw, "AIMD limit min/max\t%d / %d\n", minL, maxL)
	fmt.Fprintf(tw, "max outbox depth\t%d\n", maxDepth)
	keys := slices.Sorted(maps.Keys(res.Counts))
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%d\n", k, res.Counts[k])
	}
	checks := slices.Sorted(maps.Keys(res.Checks))
	sort.Strings(checks)
	for _, k := range checks {
		v := "FAIL"
		if res.Checks[k] {
			v = "ok"
		}
		fmt.Fprintf(tw, "check: %s\t%s\n", k, v)
	}
	_ = tw.Flush()
	if res.Report != nil {
		res.Report.Write(out)
	}
}

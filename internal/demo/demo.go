// Package demo is the guided tour behind `meshnode demo` and `make demo`: a
// three-node cluster in one process showing tell, ask, tell-reliable through
// a partition and the rejoin, and a thundering herd paced by AIMD.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/testnet"
	"golang.org/x/term"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Config sizes the demo.
type Config struct {
	Offline   int           // reliable messages sent while a node is partitioned off
	Herd      int           // messages each follower sends in the thundering herd
	LeaderCap int           // the leader's mailbox capacity in the herd
	Work      time.Duration // the leader's time per message in the herd
	Timeout   time.Duration // bound on each waiting step
}

// DefaultConfig finishes in well under a minute on two cores.
func DefaultConfig() Config {
	return Config{Offline: 500, Herd: 1500, LeaderCap: 16, Work: 200 * time.Microsecond, Timeout: 30 * time.Second}
}

// counter is an actor that counts and checks the order of what it gets.
type counter struct {
	mu       sync.Mutex
	got      int
	last     map[string]uint64
	disorder int
}

func (c *counter) handle(_ context.Context, m *node.Message) (proto.Message, error) {
	var v wrapperspb.UInt64Value
	if err := m.Decode(&v); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]uint64{}
	}
	from := m.Sender().Node
	if prev, ok := c.last[from]; ok && v.GetValue() <= prev {
		c.disorder++
	}
	c.last[from] = v.GetValue()
	c.got++
	return nil, nil
}

func (c *counter) count() (got, disorder int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.got, c.disorder
}

// Run runs the tour, printing to out. It leaves nothing running.
func Run(ctx context.Context, cfg Config, out io.Writer) (err error) {
	p := &printer{out: out, terminal: isTerminal(out)}
	start := time.Now()
	p.step("Starting a 3-node cluster on loopback (CA and certificates in a temporary directory)")
	c, err := testnet.Start(ctx, 3)
	if err != nil {
		return fmt.Errorf("demo: start cluster: %w", err)
	}
	defer func() {
		p.step("Stopping the cluster")
		if cerr := c.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("demo: stop cluster: %w", cerr)
		}
	}()
	n0, n1, n2 := c.Node(0), c.Node(1), c.Node(2)
	p.members(n0)

	var inbox counter
	for i := 0; i < 3; i++ {
		nd := c.Node(i)
		if _, err := nd.Spawn("echo", func(_ context.Context, m *node.Message) (proto.Message, error) {
			var s wrapperspb.StringValue
			if err := m.Decode(&s); err != nil {
				return nil, err
			}
			return wrapperspb.String(strings.ToUpper(s.GetValue()) + " (from " + nd.Name() + ")"), nil
		}); err != nil {
			return fmt.Errorf("demo: spawn echo: %w", err)
		}
	}
	if _, err := n2.Spawn("inventory", inbox.handle); err != nil {
		return fmt.Errorf("demo: spawn inventory: %w", err)
	}

	// Tell and ask.
	p.step("tell: n0 → echo@n1, fire and forget")
	if err := n0.Tell(ctx, node.Addr("echo", n1.Name()), wrapperspb.String("hello")); err != nil {
		return fmt.Errorf("demo: tell: %w", err)
	}
	p.say("handed to the QUIC connection")
	p.step("ask: n0 → echo@n1, request/reply with a deadline")
	var reply wrapperspb.StringValue
	askCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	t0 := time.Now()
	err = n0.Ask(askCtx, node.Addr("echo", n1.Name()), wrapperspb.String("hello"), &reply)
	cancel()
	if err != nil {
		return fmt.Errorf("demo: ask: %w", err)
	}
	p.say("reply %q in %v", reply.GetValue(), time.Since(t0).Round(time.Microsecond))
	err = n0.Ask(ctx, node.Addr("nobody", n1.Name()), wrapperspb.String("x"), nil)
	p.say("ask to a missing actor: %v (errors.Is ErrNoSuchActor = %v)", err, errors.Is(err, node.ErrNoSuchActor))

	// Partition and reliable delivery.
	p.step("partition: n2 is cut off from n0 and n1 (gossip and QUIC alike)")
	c.Isolate(2)
	if err := waitFor(ctx, cfg.Timeout, func() bool {
		st := memberState(n0, n2.Name())
		return st == "dead" || st == "left"
	}); err != nil {
		return fmt.Errorf("demo: wait for n2 to be declared down: %w", err)
	}
	p.say("n0 sees n2 as %s", memberState(n0, n2.Name()))
	err = n0.Tell(ctx, node.Addr("inventory", n2.Name()), wrapperspb.UInt64(0))
	p.say("tell to n2 now: %v (at once, no dial)", err)
	p.step(fmt.Sprintf("tell-reliable: n0 sends %d messages to inventory@n2 while it is unreachable", cfg.Offline))
	queued := 0
	bar := p.bar("queued", cfg.Offline)
	for i := 1; i <= cfg.Offline; i++ {
		outcome, err := n0.TellReliable(ctx, node.Addr("inventory", n2.Name()), wrapperspb.UInt64(uint64(i)))
		if err != nil {
			return fmt.Errorf("demo: tell-reliable %d: %w", i, err)
		}
		if outcome == node.Queued {
			queued++
		}
		bar.set(i)
	}
	bar.done()
	st := n0.Outbox().Stats()
	p.say("%d Queued (fsynced in n0's outbox); outbox depth %d, oldest %v", queued, st.Depth, st.OldestAge.Round(time.Millisecond))

	p.step("heal: the partition ends; membership sees n2 alive and n0's relay drains its queue at once")
	healed := time.Now()
	c.Heal()
	bar = p.bar("delivered", cfg.Offline)
	if err := waitFor(ctx, cfg.Timeout, func() bool {
		got, _ := inbox.count()
		bar.set(got)
		return got >= cfg.Offline && n0.Outbox().Stats().Depth == 0
	}); err != nil {
		return fmt.Errorf("demo: drain after heal: %w", err)
	}
	bar.done()
	got, disorder := inbox.count()
	p.say("inventory@n2 processed %d messages, %d out of order, %v after the heal", got, disorder, time.Since(healed).Round(time.Millisecond))

	// Thundering herd.
	herd, err := thunderingHerd(ctx, c, cfg, p)
	if err != nil {
		return err
	}

	p.step("Summary")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "what\tresult")
	fmt.Fprintf(tw, "ask round trip\t%q\n", reply.GetValue())
	fmt.Fprintf(tw, "reliable while partitioned\t%d queued, %d delivered after heal, %d out of order\n", queued, got, disorder)
	fmt.Fprintf(tw, "thundering herd\t%d sent, %d processed, %d capacity receipts, %d lost\n", herd.sent, herd.processed, herd.capacity, herd.sent-herd.processed)
	fmt.Fprintf(tw, "AIMD limit n1→n0\tstart %d, peak %d, lowest after the peak %d, end %d\n", herd.first, herd.peak, herd.trough, herd.last)
	fmt.Fprintf(tw, "total time\t%v\n", time.Since(start).Round(time.Millisecond))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("demo: print summary: %w", err)
	}
	if got != cfg.Offline || disorder != 0 || herd.processed != herd.sent {
		return fmt.Errorf("demo: messages lost or out of order (see the summary)")
	}
	return nil
}

type herdResult struct {
	sent, processed, capacity int
	first, peak, trough, last int // AIMD limit: at start, highest, lowest after the peak, at the end
}

// thunderingHerd: n1 and n2 queue messages for a slow leader on n0 with a
// small mailbox, then all arrive at once; AIMD backs off and nothing is lost.
func thunderingHerd(ctx context.Context, c *testnet.Cluster, cfg Config, p *printer) (herdResult, error) {
	n0 := c.Node(0)
	var processed atomic.Int64
	_, err := n0.Spawn("leader", func(_ context.Context, m *node.Message) (proto.Message, error) {
		deadline := time.Now().Add(cfg.Work)
		for time.Now().Before(deadline) { // simulated work that holds the CPU
		}
		processed.Add(1)
		return nil, nil
	}, node.WithMailbox(cfg.LeaderCap, mailbox.Reject))
	if err != nil {
		return herdResult{}, fmt.Errorf("demo: spawn leader: %w", err)
	}
	p.step(fmt.Sprintf("thundering herd: n0 (the leader, mailbox %d) is partitioned off; n1 and n2 queue %d messages each for it", cfg.LeaderCap, cfg.Herd))
	c.Isolate(0)
	followers := []*node.Node{c.Node(1), c.Node(2)}
	if err := waitFor(ctx, cfg.Timeout, func() bool {
		for _, f := range followers {
			if st := memberState(f, n0.Name()); st != "dead" && st != "left" {
				return false
			}
		}
		return true
	}); err != nil {
		return herdResult{}, fmt.Errorf("demo: wait for n0 to be declared down: %w", err)
	}
	res := herdResult{sent: cfg.Herd * len(followers), first: 10, peak: 10, trough: 10}
	targets := make([]node.Address, cfg.Herd)
	for i := range targets {
		targets[i] = node.Addr("leader", n0.Name())
	}
	for _, f := range followers {
		r, err := f.Dispatch(ctx, targets, wrapperspb.UInt64(1))
		if err != nil || r.Rejected > 0 {
			return res, fmt.Errorf("demo: herd dispatch from %s: %+v: %w", f.Name(), r, err)
		}
		p.say("%s: %d queued in one group commit", f.Name(), r.Accepted)
	}
	p.step("the partition heals: both followers' relays drain into the leader at once")
	c.Heal()
	bar := p.bar("processed", res.sent)
	var samples []string
	lastSample := time.Time{}
	err = waitFor(ctx, cfg.Timeout, func() bool {
		lim := followers[0].Outbox().Stats().LimitByPeer[n0.Name()]
		if lim > res.peak {
			res.peak, res.trough = lim, lim
		}
		if lim > 0 && lim < res.trough {
			res.trough = lim
		}
		if lim > 0 {
			res.last = lim
		}
		if lim > 0 && time.Since(lastSample) > 250*time.Millisecond {
			samples = append(samples, fmt.Sprint(lim))
			lastSample = time.Now()
		}
		bar.set(int(processed.Load()))
		return int(processed.Load()) >= res.sent
	})
	if err != nil {
		return res, fmt.Errorf("demo: herd: %w", err)
	}
	bar.done()
	res.processed = int(processed.Load())
	res.capacity = int(n0.Stats().RefusedFull)
	p.say("AIMD limit of n1 toward n0, sampled every 250 ms: %s", strings.Join(samples, " → "))
	p.say("the leader refused %d deliveries with CAPACITY; senders halved their limit and retried after the hint", res.capacity)
	return res, nil
}

func memberState(n *node.Node, name string) string {
	for _, m := range n.Members() {
		if m.Name == name {
			return m.State.String()
		}
	}
	return "unknown"
}

// waitFor polls cond every 20 ms until it holds, the timeout passes or ctx ends.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("timed out after %v", timeout)
		case <-tick.C:
		}
	}
	return nil
}

// printer writes numbered steps and progress bars. Bars redraw in place
// with '\r' only on a terminal; into a pipe or a file they print one line
// when done, so logs hold no control characters.
type printer struct {
	out      io.Writer
	terminal bool
	n        int
}

// isTerminal reports whether w is an interactive terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (p *printer) step(s string) { p.n++; fmt.Fprintf(p.out, "\n[%d] %s\n", p.n, s) }
func (p *printer) say(format string, args ...any) {
	fmt.Fprintf(p.out, "    "+format+"\n", args...)
}

func (p *printer) members(n *node.Node) {
	ms := n.Members()
	sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
	for _, m := range ms {
		p.say("%-4s %-7s gossip %-21s quic %s", m.Name, m.State, m.GossipAddr, m.QUICAddr)
	}
}

type bar struct {
	p     *printer
	label string
	total int
	shown int
}

func (p *printer) bar(label string, total int) *bar {
	b := &bar{p: p, label: label, total: total, shown: -1}
	b.set(0)
	return b
}

func (b *bar) set(v int) {
	const width = 30
	filled := width * min(v, b.total) / max(b.total, 1)
	if filled == b.shown {
		return
	}
	b.shown = filled
	if b.p.terminal {
		fmt.Fprintf(b.p.out, "\r    %-10s [%s%s] %d/%d", b.label, strings.Repeat("#", filled), strings.Repeat(".", width-filled), min(v, b.total), b.total)
	}
}

func (b *bar) done() {
	b.set(b.total)
	if b.p.terminal {
		fmt.Fprintln(b.p.out)
		return
	}
	fmt.Fprintf(b.p.out, "    %-10s %d/%d done\n", b.label, b.total, b.total)
}

package metrics_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/metrics"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/node/nodetest"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/transport"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { testutil.VerifyTestMain(m) } // a test runs a real node

// fakeSource is a node whose snapshots the test sets.
type fakeSource struct {
	mu      sync.Mutex
	members []mesh.Member
	stats   node.Stats
	outbox  node.OutboxStats
	actors  []node.ActorStats
	peers   map[string]transport.PeerStats
}

func (f *fakeSource) Name() string { return "self" }
func (f *fakeSource) Members() []mesh.Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.members)
}
func (f *fakeSource) Stats() node.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}
func (f *fakeSource) OutboxStats() node.OutboxStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.outbox
}
func (f *fakeSource) ActorStats() []node.ActorStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.actors)
}
func (f *fakeSource) PeerStats() map[string]transport.PeerStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]transport.PeerStats{}
	for k, v := range f.peers {
		out[k] = v
	}
	return out
}

// gather scrapes c through a pedantic registry (which checks descriptors,
// label consistency and duplicate series) and returns the families by name.
func gather(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// value returns the sample of family name whose labels include want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if got[want[i]] != want[i+1] {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func newSource() *fakeSource {
	return &fakeSource{
		members: []mesh.Member{{Name: "self", State: mesh.StateAlive}, {Name: "a", State: mesh.StateAlive}, {Name: "b", State: mesh.StateDead}},
		stats: node.Stats{TellSent: 5, TellFailed: 2, AskOK: 3, ReliableQueued: 7, DedupeHits: 1, Forgotten: 2, Actors: 2,
			SenderMismatch: 4, ResponsesRefused: 6, RefusedPeerBytes: 8,
			Forward: node.ForwardStats{Sent: 21, Carried: 22, Refused: 23, BadReceipts: 24},
			Gossip:  mesh.Traffic{Sent: 31, Received: 32},
			Refused: transport.Refusals{IdentityMismatch: 3, UnknownCA: 12, NoCertificate: 13, BadCertificate: 14}},
		outbox: node.OutboxStats{Stats: outbox.Stats{Depth: 4, DepthByPeer: map[string]int{"a": 4},
			OldestAge: 2 * time.Second, Fsyncs: 9, CommitFailures: 3, Enqueued: 11, StreamsForgotten: 5,
			Failure: "outbox: store failed: fdatasync: input/output error"}, LimitByPeer: map[string]int{"a": 10, "c": 1}, Restores: 2},
		actors: []node.ActorStats{{Name: "idle"}, {Name: "busy"}},
		peers:  map[string]transport.PeerStats{"a": {FramesIn: 1, FramesOut: 2, BytesIn: 30, BytesOut: 40, WritesOut: 5, Connected: true}, "b": {}},
	}
}

func TestCollectorValues(t *testing.T) {
	src := newSource()
	src.actors[1].Depth, src.actors[1].Rejected = 3, 2
	fams := gather(t, metrics.New(src))
	tests := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"meshnode_members", []string{"state", "alive"}, 2},
		{"meshnode_members", []string{"state", "dead"}, 1},
		{"meshnode_members", []string{"state", "suspect"}, 0},
		{"meshnode_tell_total", []string{"outcome", "failed"}, 2},
		{"meshnode_reliable_total", []string{"outcome", "queued"}, 7},
		{"meshnode_dedupe_hits_total", nil, 1},
		{"meshnode_stream_refused_total", []string{"reason", "forgotten"}, 2},
		{"meshnode_identity_mismatches_total", nil, 3},
		{"meshnode_handshakes_refused_total", []string{"reason", "unknown_ca"}, 12},
		{"meshnode_handshakes_refused_total", []string{"reason", "no_certificate"}, 13},
		{"meshnode_handshakes_refused_total", []string{"reason", "bad_certificate"}, 14},
		{"meshnode_sender_mismatches_total", nil, 4},
		{"meshnode_ask_responses_refused_total", nil, 6},
		{"meshnode_peer_bytes_refused_total", nil, 8},
		{"meshnode_forwarded_refused_total", nil, 23},
		{"meshnode_forwarded_total", []string{"event", "sent"}, 21},
		{"meshnode_forwarded_total", []string{"event", "carried"}, 22},
		{"meshnode_forwarded_total", []string{"event", "bad_receipt"}, 24},
		{"meshnode_forwarded_total", []string{"event", "accepted"}, 0},
		{"meshnode_outbox_depth", nil, 4},
		{"meshnode_outbox_oldest_age_seconds", nil, 2},
		{"meshnode_outbox_fsyncs_total", nil, 9},
		{"meshnode_outbox_commit_failures_total", nil, 3},
		{"meshnode_outbox_failed", nil, 1},
		{"meshnode_outbox_stream_restores_total", nil, 2},
		{"meshnode_outbox_streams_forgotten_total", nil, 5},
		{"meshnode_outbox_peer_depth", []string{"peer", "a"}, 4},
		{"meshnode_outbox_aimd_limit", []string{"peer", "c"}, 1},
		{"meshnode_peer_bytes_total", []string{"peer", "a", "direction", "out"}, 40},
		{"meshnode_peer_writes_total", []string{"peer", "a"}, 5},
		{"meshnode_connections", nil, 1},
		{"meshnode_gossip_bytes_total", []string{"direction", "sent"}, 31},
		{"meshnode_gossip_bytes_total", []string{"direction", "received"}, 32},
		{"meshnode_mailbox_depth", []string{"actor", "busy"}, 3},
		{"meshnode_mailbox_drops_total", []string{"actor", "busy", "reason", "rejected"}, 2},
	}
	for _, tt := range tests {
		got, ok := value(t, fams, tt.name, tt.labels...)
		if !ok || got != tt.want {
			t.Errorf("%s%v = %v (present %v), want %v", tt.name, tt.labels, got, ok, tt.want)
		}
	}
	if _, ok := value(t, fams, "meshnode_mailbox_depth", "actor", "idle"); ok {
		t.Error("an idle actor has a meshnode_mailbox_depth series")
	}
	for _, gone := range []string{"meshnode_mailbox_dropped_total", "meshnode_outbox_dedupe_hits_total", "meshnode_ask_mean_latency_seconds"} {
		if _, ok := fams[gone]; ok {
			t.Errorf("%s is still exported (replaced by one family)", gone)
		}
	}
}

// Every peer gets every per-peer series, and a peer's series stay after it
// leaves every snapshot.
func TestPerPeerSeriesAreConsistent(t *testing.T) {
	src := newSource()
	c := metrics.New(src)
	perPeer := []string{"meshnode_outbox_peer_depth", "meshnode_outbox_aimd_limit", "meshnode_peer_frames_total", "meshnode_peer_bytes_total", "meshnode_peer_writes_total"}
	check := func(fams map[string]*dto.MetricFamily, peers ...string) {
		t.Helper()
		for _, name := range perPeer {
			for _, p := range peers {
				if _, ok := value(t, fams, name, "peer", p); !ok {
					t.Errorf("%s has no series for peer %q", name, p)
				}
			}
			if _, ok := value(t, fams, name, "peer", "self"); ok {
				t.Errorf("%s has a series for this node itself", name)
			}
		}
	}
	check(gather(t, c), "a", "b", "c")

	src.mu.Lock()
	src.members = src.members[:1]
	src.outbox = node.OutboxStats{}
	src.peers = nil
	src.mu.Unlock()
	fams := gather(t, c)
	check(fams, "a", "b", "c")
	if v, _ := value(t, fams, "meshnode_outbox_peer_depth", "peer", "a"); v != 0 {
		t.Errorf("drained peer depth = %v, want 0", v)
	}
}

func TestHistograms(t *testing.T) {
	c := metrics.New(newSource())
	c.ObserveAsk(3*time.Millisecond, nil)
	c.ObserveAsk(time.Second, errors.New("unreachable"))
	h := c.InstrumentHandler("orders", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		return nil, nil
	})
	for range 3 {
		if _, err := h(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	fams := gather(t, c)
	if n, _ := value(t, fams, "meshnode_ask_duration_seconds", "outcome", "ok"); n != 1 {
		t.Errorf("ok asks observed = %v, want 1", n)
	}
	if n, _ := value(t, fams, "meshnode_ask_duration_seconds", "outcome", "failed"); n != 1 {
		t.Errorf("failed asks observed = %v, want 1", n)
	}
	if n, _ := value(t, fams, "meshnode_handler_duration_seconds", "actor", "orders", "outcome", "ok"); n != 3 {
		t.Errorf("handler calls observed = %v, want 3", n)
	}
	if fams["meshnode_ask_duration_seconds"].GetType() != dto.MetricType_HISTOGRAM {
		t.Error("ask latency is not a histogram")
	}
}

// Names lists exactly the families a scrape can show, and every family has
// a HELP text that is a sentence.
func TestNamesAndHelp(t *testing.T) {
	src := newSource()
	src.actors[1].Depth = 1
	c := metrics.New(src)
	c.ObserveAsk(time.Millisecond, nil)
	c.InstrumentHandler("x", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil })(context.Background(), nil) //nolint:errcheck
	fams := gather(t, c)
	var got []string
	for name, f := range fams {
		got = append(got, name)
		if h := f.GetHelp(); len(h) < 10 || !strings.HasSuffix(h, ".") {
			t.Errorf("%s HELP %q is not a sentence", name, h)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, metrics.Names) {
		t.Errorf("scraped families\n%v\nNames\n%v", got, metrics.Names)
	}
}

// TestCallsObserveEveryAskAndHandler: installed in a node's config, Calls
// time every ask (by outcome) and every handler run (by actor); tells are
// not asks.
func TestCallsObserveEveryAskAndHandler(t *testing.T) {
	calls := metrics.NewCalls()
	c := nodetest.New(t, []string{"a"}, nodetest.WithConfig(calls.Install), nodetest.WithSetup(func(n *node.Node) error {
		_, err := n.Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) { return wrapperspb.String("r"), nil })
		return err
	}))
	n := c.Node("a")
	col := metrics.New(metrics.ForNode(n), metrics.WithCalls(calls))
	ctx := context.Background()
	if err := n.Ask(ctx, node.Addr("echo", "a"), wrapperspb.String("q"), nil); err != nil {
		t.Fatal(err)
	}
	if err := n.Ask(ctx, node.Addr("nobody", "a"), wrapperspb.String("q"), nil); err == nil {
		t.Fatal("ask to no actor succeeded")
	}
	if err := n.Tell(ctx, node.Addr("echo", "a"), wrapperspb.String("t")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "two handler runs observed", func() bool {
		v, _ := value(t, gather(t, col), "meshnode_handler_duration_seconds", "actor", "echo", "outcome", "ok")
		return v == 2
	})
	fams := gather(t, col)
	if v, _ := value(t, fams, "meshnode_ask_duration_seconds", "outcome", "ok"); v != 1 {
		t.Errorf("ok asks = %v, want 1", v)
	}
	if v, _ := value(t, fams, "meshnode_ask_duration_seconds", "outcome", "failed"); v != 1 {
		t.Errorf("failed asks = %v, want 1", v)
	}
}

package mesh

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
)

func metaBytes(tb testing.TB, m *pb.NodeMeta) []byte {
	tb.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestDiff(t *testing.T) {
	alive := Member{Name: "a", BootID: "b1", QUICAddr: "q1", GossipAddr: "g1", State: StateAlive}
	with := func(f func(*Member)) Member { m := alive; f(&m); return m }
	for _, tc := range []struct {
		name  string
		prev  Member
		known bool
		cur   Member
		want  EventKind
		ok    bool
	}{
		{"first alive", Member{}, false, alive, EventJoin, true},
		{"first suspect", Member{}, false, with(func(m *Member) { m.State = StateSuspect }), EventJoin, true},
		{"first dead", Member{}, false, with(func(m *Member) { m.State = StateDead }), 0, false},
		{"no change", alive, true, alive, 0, false},
		{"suspect", alive, true, with(func(m *Member) { m.State = StateSuspect }), EventSuspect, true},
		{"refuted", with(func(m *Member) { m.State = StateSuspect }), true, alive, EventAlive, true},
		{"dead", alive, true, with(func(m *Member) { m.State = StateDead }), EventDead, true},
		{"left", alive, true, with(func(m *Member) { m.State = StateLeft }), EventLeft, true},
		{"back", with(func(m *Member) { m.State = StateDead }), true, alive, EventAlive, true},
		{"back suspect", with(func(m *Member) { m.State = StateDead }), true, with(func(m *Member) { m.State = StateSuspect }), EventAlive, true},
		{"restart", with(func(m *Member) { m.State = StateDead }), true, with(func(m *Member) { m.BootID = "b2" }), EventRestart, true},
		{"restart unnoticed", alive, true, with(func(m *Member) { m.BootID = "b2" }), EventRestart, true},
		{"dead new boot is dead", alive, true, with(func(m *Member) { m.BootID = "b2"; m.State = StateDead }), EventDead, true},
		{"quic moved", alive, true, with(func(m *Member) { m.QUICAddr = "q2" }), EventUpdate, true},
		{"gossip moved", alive, true, with(func(m *Member) { m.GossipAddr = "g2" }), EventUpdate, true},
		{"versions", alive, true, with(func(m *Member) { m.ProtocolVersions = []uint32{2, 3} }), EventUpdate, true},
		{"tags", alive, true, with(func(m *Member) { m.Tags = map[string]string{"zone": "b"} }), EventUpdate, true},
		{"same tags", with(func(m *Member) { m.Tags = map[string]string{"zone": "b"} }), true, with(func(m *Member) { m.Tags = map[string]string{"zone": "b"} }), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := diff(tc.prev, tc.known, tc.cur)
			if got != tc.want || ok != tc.ok {
				t.Errorf("diff = %v,%v want %v,%v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestStrings(t *testing.T) {
	for s, want := range map[State]string{StateAlive: "alive", StateSuspect: "suspect", StateDead: "dead", StateLeft: "left", 9: "state(9)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q", s, s.String())
		}
	}
	if EventRestart.String() != "restart" || EventKind(0).String() != "event(0)" {
		t.Error("EventKind.String")
	}
}

func TestCheckPeer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		raw    []byte
		reason string
	}{
		{"ok", metaBytes(t, &pb.NodeMeta{Cluster: "a", ProtocolVersions: []uint32{2}}), ""},
		{"ok with newer too", metaBytes(t, &pb.NodeMeta{Cluster: "a", ProtocolVersions: []uint32{2, 7}}), ""},
		{"missing", nil, "empty"},
		{"garbage", []byte{0xff, 0xff, 0xff}, "bad message"},
		{"other cluster", metaBytes(t, &pb.NodeMeta{Cluster: "b", ProtocolVersions: []uint32{2}}), `cluster "b" != "a"`},
		{"previous protocol", metaBytes(t, &pb.NodeMeta{Cluster: "a", ProtocolVersions: []uint32{1}}), "no compatible protocol version in [1]"},
		{"no versions", metaBytes(t, &pb.NodeMeta{Cluster: "a"}), "no compatible protocol"},
		{"future only", metaBytes(t, &pb.NodeMeta{Cluster: "a", ProtocolVersions: []uint32{9}}), "no compatible protocol"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkPeer("a", tc.raw)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("err = %v, want ErrRefused containing %q", err, tc.reason)
			}
		})
	}
}

// newBare builds a Mesh without memberlist, enough to drive the delegates.
func newBare(tb testing.TB, logs io.Writer) *Mesh {
	tb.Helper()
	cfg := DefaultConfig("self")
	cfg.Cluster = "a"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	return &Mesh{
		cfg: cfg, log: cfg.Logger, notify: make(chan struct{}, 1), done: make(chan struct{}),
		view: map[string]Member{}, changed: map[string]struct{}{}, leaving: map[string]string{}, refused: map[string]string{}, moved: map[string]string{},
	}
}

func TestDelegateRefusalLoggedOnce(t *testing.T) {
	var logs strings.Builder
	m := newBare(t, &logs)
	d := &delegate{m: m}
	bad := &memberlist.Node{Name: "x", Meta: metaBytes(t, &pb.NodeMeta{Cluster: "b", ProtocolVersions: []uint32{2}})}
	for range 3 {
		if err := d.NotifyAlive(bad); !errors.Is(err, ErrRefused) {
			t.Fatalf("NotifyAlive = %v", err)
		}
	}
	if got := strings.Count(logs.String(), `refusing node x: cluster \"b\" != \"a\"`); got != 1 {
		t.Errorf("logged %d times, want 1:\n%s", got, logs.String())
	}
	if err := d.NotifyAlive(&memberlist.Node{Name: "self"}); err != nil {
		t.Errorf("self refused: %v", err)
	}
}

func TestDelegateStates(t *testing.T) {
	m := newBare(t, io.Discard)
	d := &delegate{m: m}
	meta := metaBytes(t, &pb.NodeMeta{Cluster: "a", BootId: "b1", QuicAddr: "q", ProtocolVersions: []uint32{2}})
	n := &memberlist.Node{Name: "p", Addr: []byte{127, 0, 0, 1}, Port: 7946, Meta: meta}
	step := func(f func(), want State) {
		t.Helper()
		f()
		if got := m.view["p"].State; got != want {
			t.Fatalf("state %v, want %v", got, want)
		}
	}
	step(func() { d.NotifyJoin(n) }, StateAlive)
	if a, err := m.Resolve("p"); err != nil || a != "q" {
		t.Fatalf("Resolve = %q %v", a, err)
	}
	step(func() { m.markSuspect("p") }, StateSuspect)
	if _, err := m.Resolve("p"); err != nil {
		t.Fatalf("suspect must resolve: %v", err)
	}
	step(func() { d.NotifyUpdate(n) }, StateSuspect) // an update alone does not refute
	step(func() {
		if err := d.NotifyAlive(n); err != nil {
			t.Fatal(err)
		}
	}, StateSuspect) // nor does an alive message, which may be stale gossip
	step(func() { d.NotifyPingComplete(n, time.Millisecond, nil) }, StateAlive)
	step(func() { d.NotifyLeave(n) }, StateDead)
	if _, err := m.Resolve("p"); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Resolve dead = %v", err)
	}
	// A leave intent that arrives after the death turns it into Left.
	d.NotifyMsg(encodeLeaveIntent("p", "b1", "a"))
	step(func() {}, StateLeft)
	// Intent of another cluster is ignored; garbage does not panic.
	d.NotifyMsg(encodeLeaveIntent("q", "b1", "z"))
	d.NotifyMsg([]byte{0})
	if _, ok := m.leaving["q"]; ok {
		t.Error("intent from another cluster recorded")
	}
	step(func() { d.NotifyJoin(n) }, StateAlive)
	step(func() { d.NotifyLeave(n) }, StateLeft) // intent with the same boot id still stands
	n2 := *n
	n2.Meta = metaBytes(t, &pb.NodeMeta{Cluster: "a", BootId: "b2", ProtocolVersions: []uint32{2}})
	step(func() { d.NotifyJoin(&n2) }, StateAlive)
	step(func() { d.NotifyLeave(&n2) }, StateDead) // new boot: old intent forgotten
}

func TestPeersFile(t *testing.T) {
	dir := t.TempDir()
	if got, err := loadPeers(dir); err != nil || got != nil {
		t.Fatalf("missing file: %v %v", got, err)
	}
	want := []peerRecord{{"b", "127.0.0.1:2"}, {"a", "127.0.0.1:1"}}
	if err := savePeers(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := loadPeers(dir)
	if err != nil || len(got) != 2 || got[0].Name != "a" || got[1].Addr != "127.0.0.1:2" {
		t.Fatalf("loadPeers = %v %v", got, err)
	}
	for _, bad := range []string{"{", `{"peers":[{"name":"x","addr":"nope"}]}`, "null x"} {
		if _, err := decodePeers([]byte(bad)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("decodePeers(%q) = %v", bad, err)
		}
	}
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte{})
	f.Add(metaBytes(f, &pb.NodeMeta{Cluster: "a", BootId: "x", QuicAddr: "1.2.3.4:5", ProtocolVersions: []uint32{2}}))
	f.Add([]byte{0x0a, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		err := checkPeer("a", b)
		if m, derr := decodeMeta(b); derr == nil && m.GetCluster() == "a" && pb.Compatible(m.GetProtocolVersions()) && err != nil {
			t.Fatalf("valid meta refused: %v", err)
		}
	})
}

func FuzzDecodeLeaveIntent(f *testing.F) {
	f.Add(encodeLeaveIntent("n1", "boot", "c"))
	f.Add([]byte{msgLeaveIntent})
	f.Add([]byte{msgLeaveIntent, 0x0a, 0x80})
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeLeaveIntent(b)
		if err == nil && h.GetNodeName() == "" {
			t.Fatal("accepted an intent without a name")
		}
		if err != nil && !errors.Is(err, ErrBadMessage) {
			t.Fatalf("error not ErrBadMessage: %v", err)
		}
	})
}

func FuzzDecodePeers(f *testing.F) {
	f.Add([]byte(`{"peers":[{"name":"a","addr":"127.0.0.1:1"}]}`))
	f.Add([]byte(`{"peers":null}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := decodePeers(b); err != nil && !errors.Is(err, ErrBadMessage) {
			t.Fatalf("error not ErrBadMessage: %v", err)
		}
	})
}

func FuzzMemberlistLogLine(f *testing.F) {
	f.Add("[INFO] memberlist: Suspect n1 has failed, no acks received\n")
	f.Add("[INFO] memberlist: Suspect  has failed, no acks received")
	f.Add("memberlist: Suspect has failed, no acks received")
	f.Fuzz(func(t *testing.T, line string) {
		w := &mlLogWriter{log: slog.New(slog.DiscardHandler), onSuspect: func(string) {}}
		if n, err := w.Write([]byte(line)); n != len(line) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	})
}

func BenchmarkResolve(b *testing.B) {
	m := newBare(b, io.Discard)
	for i := range 100 {
		name := "n" + string(rune('A'+i%26)) + string(rune('a'+i/26))
		m.view[name] = Member{Name: name, QUICAddr: "127.0.0.1:1", State: StateAlive}
	}
	m.view["target"] = Member{Name: "target", QUICAddr: "127.0.0.1:9", State: StateAlive}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := m.Resolve("target"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "resolves/s")
}

func BenchmarkNotifyAlive(b *testing.B) {
	m := newBare(b, io.Discard)
	d := &delegate{m: m}
	n := &memberlist.Node{Name: "p", Meta: metaBytes(b, &pb.NodeMeta{Cluster: "a", BootId: "b", QuicAddr: "q", ProtocolVersions: []uint32{2}})}
	b.ReportAllocs()
	for b.Loop() {
		if err := d.NotifyAlive(n); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func BenchmarkNotifyJoinLeave(b *testing.B) {
	m := newBare(b, io.Discard)
	d := &delegate{m: m}
	n := &memberlist.Node{Name: "p", Addr: []byte{127, 0, 0, 1}, Port: 1, Meta: metaBytes(b, &pb.NodeMeta{Cluster: "a", BootId: "b", QuicAddr: "q", ProtocolVersions: []uint32{2}})}
	b.ReportAllocs()
	for b.Loop() {
		d.NotifyJoin(n)
		d.NotifyLeave(n)
	}
}

func TestSuspicionExpires(t *testing.T) {
	m := newBare(t, io.Discard)
	d := &delegate{m: m}
	meta := metaBytes(t, &pb.NodeMeta{Cluster: "a", BootId: "b1", QuicAddr: "q", ProtocolVersions: []uint32{2}})
	d.NotifyJoin(&memberlist.Node{Name: "p", Addr: []byte{127, 0, 0, 1}, Port: 7946, Meta: meta})
	m.markSuspect("p")
	since := m.view["p"].Since
	limit := m.cfg.maxSuspicion(len(m.view)) + m.cfg.ProbeInterval
	m.expireSuspicions(since.Add(limit))
	if got := m.view["p"].State; got != StateSuspect {
		t.Fatalf("suspicion ended within memberlist's timeout: %v", got)
	}
	m.expireSuspicions(since.Add(limit + time.Millisecond))
	if got := m.view["p"].State; got != StateAlive {
		t.Fatalf("suspicion outlived memberlist's longest timeout: %v", got)
	}
	// Dead members are memberlist's to revive, not the timer's.
	d.NotifyLeave(&memberlist.Node{Name: "p", Addr: []byte{127, 0, 0, 1}, Port: 7946, Meta: meta})
	m.expireSuspicions(time.Now().Add(time.Hour))
	if got := m.view["p"].State; got != StateDead {
		t.Fatalf("a dead member became %v", got)
	}
}

// addMembers puts n members named prefix0.. in m's view, at gossip
// addresses host:0.., in state since since.
func addMembers(m *Mesh, prefix, host string, n int, state State, since time.Time) {
	for i := range n {
		name := fmt.Sprintf("%s%d", prefix, i)
		m.view[name] = Member{Name: name, GossipAddr: fmt.Sprintf("%s:%d", host, i), State: state, Since: since}
	}
}

// Failed members are re-joined by about reconnectFanout members of the
// cluster per round, not by every member: each member tries each with
// probability reconnectFanout/(reachable members). Seeds are always tried.
func TestReconnectTargetsSampled(t *testing.T) {
	m := newBare(t, io.Discard)
	m.cfg.Join = []string{"seed:1"}
	now := time.Now()
	addMembers(m, "alive", "a", 40, StateAlive, now)
	addMembers(m, "dead", "d", 10, StateDead, now)
	const rounds = 2000
	dead, seed := 0, 0
	for range rounds {
		for _, a := range m.reconnectTargets(now.Add(-m.cfg.ReconnectInterval), now) {
			switch {
			case a == "seed:1":
				seed++
			case strings.HasPrefix(a, "d:"):
				dead++
			default:
				t.Fatalf("target %s is alive", a)
			}
		}
	}
	if seed != rounds {
		t.Errorf("seed tried in %d of %d rounds", seed, rounds)
	}
	// Expected 10 dead × 2/40 = 0.5 per round: 1,000 of 2,000 (σ ≈ 31).
	if want := rounds * 10 * reconnectFanout / 40; dead < want*8/10 || dead > want*12/10 {
		t.Errorf("dead members tried %d times in %d rounds, want about %d", dead, rounds, want)
	}

	// A member alone, or with few reachable peers, tries every failed one.
	for name := range m.view {
		if strings.HasPrefix(name, "alive") && name != "alive0" {
			delete(m.view, name)
		}
	}
	if got := len(m.reconnectTargets(now.Add(-m.cfg.ReconnectInterval), now)); got != 1+10 {
		t.Errorf("with one reachable peer, %d targets, want the seed and all 10 failed", got)
	}
}

// The handoff queue memberlist runs with is the one the config names.
func TestMemberlistConfigHandoffQueue(t *testing.T) {
	for _, c := range []Config{DefaultConfig("n"), PresetFor("n", 200)} {
		if got := c.memberlistConfig().HandoffQueueDepth; got != c.HandoffQueueDepth {
			t.Errorf("memberlist HandoffQueueDepth %d, config %d", got, c.HandoffQueueDepth)
		}
	}
	bad := DefaultConfig("n")
	bad.HandoffQueueDepth = 0
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "HandoffQueueDepth") {
		t.Errorf("HandoffQueueDepth 0: Validate = %v", err)
	}
}

// A member seen failing is retried 1, 2, 4, ... 32 rounds after the failure
// (the quickest repair of a false death) by about retryFanout members of
// the cluster, on top of the round's sampling; rounds late or early by up
// to half an interval change nothing.
func TestReconnectRetriesAfterFailure(t *testing.T) {
	m := newBare(t, io.Discard)
	iv := m.cfg.ReconnectInterval
	failed := time.Now()
	var due []int
	prev := failed
	for i := 1; i <= 100; i++ {
		now := failed.Add(time.Duration(i) * iv).Add(time.Duration(i%3-1) * iv / 3) // jitter -1/3, 0, +1/3
		if m.retryDue(failed, prev, now) {
			due = append(due, i)
		}
		prev = now
	}
	if want := []int{1, 2, 4, 8, 16, 32}; !slices.Equal(due, want) {
		t.Fatalf("retries in rounds %v, want %v", due, want)
	}

	// Through reconnectTargets: with 8 reachable members (retryFanout) a
	// failure one interval old is retried every time.
	now := time.Now()
	addMembers(m, "alive", "a", retryFanout, StateAlive, now)
	tried := func(rounds int, since time.Time) (n int) {
		m.view["dead"] = Member{Name: "dead", GossipAddr: "d:1", State: StateDead, Since: since}
		for range rounds {
			if slices.Contains(m.reconnectTargets(now.Add(-iv/2), now), "d:1") {
				n++
			}
		}
		return n
	}
	if got := tried(50, now.Add(-iv)); got != 50 {
		t.Fatalf("with %d reachable members a failure one interval old was retried in %d of 50 rounds", retryFanout, got)
	}

	// With 40 reachable members each member takes a retry with probability
	// 8/40 (about 8 retriers in the cluster) and the round's sampling adds
	// 2/40: 0.2 + 0.8 × 0.05 = 0.24 of the rounds. Between retry times only
	// the sampling's 0.05 remains.
	addMembers(m, "more", "b", 40-retryFanout, StateAlive, now)
	const rounds = 10000
	for _, tc := range []struct {
		since time.Time
		p     float64
	}{{now.Add(-iv), 0.24}, {now.Add(-3 * iv), 0.05}} {
		want := tc.p * rounds // ±20 % is more than 4σ for either p
		if got := float64(tried(rounds, tc.since)); got < want*0.8 || got > want*1.2 {
			t.Errorf("failed %v ago: tried in %.0f of %d rounds, want about %.0f", now.Sub(tc.since), got, rounds, want)
		}
	}
}

// Joins that hang (a seed that accepts and never answers, each Join
// waiting TCPTimeout) do not hold up the reconnect loop's housekeeping: a
// Suspect state still ends once memberlist's longest suspicion timeout has
// passed, not after the round's Joins.
func TestSuspicionExpiresWhileJoinsHang(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	var held []net.Conn
	var heldMu sync.Mutex
	var seeds []string
	for range 6 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				heldMu.Lock()
				held = append(held, c) // never read, never answered
				heldMu.Unlock()
			}
		}()
		seeds = append(seeds, ln.Addr().String())
	}
	t.Cleanup(func() {
		heldMu.Lock()
		defer heldMu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	cfg := DefaultConfig("self")
	cfg.Cluster = "test"
	cfg.BindAddr = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Meta = &pb.NodeMeta{QuicAddr: "127.0.0.1:1"}
	cfg.Join = seeds
	cfg.Logger = slog.New(slog.DiscardHandler)
	m, err := New(cfg) // the seeds' Joins time out (6 s): New still succeeds
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Kill() })
	// Each round now spends 6 × TCPTimeout (6 s) in Joins.

	m.mu.Lock()
	m.setLocked("p", Member{Name: "p", GossipAddr: "127.0.0.1:2", State: StateAlive, Since: time.Now()})
	m.mu.Unlock()
	m.markSuspect("p")
	limit := cfg.maxSuspicion(len(m.Members())) + 3*cfg.ReconnectInterval
	testutil.WaitFor(t, limit, "p Alive again while the seeds' Joins hang", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.view["p"].State == StateAlive
	})
}

func stateOf(m *Mesh, name string) State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.view[name].State
}

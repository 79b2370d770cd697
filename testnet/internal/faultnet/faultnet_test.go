package faultnet

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/meshnode/meshnode/internal/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// udpPair wraps two raw UDP sockets as nodes a and b.
func udpPair(tb testing.TB, n *Network) (a, b net.PacketConn) {
	tb.Helper()
	open := func(name string) net.PacketConn {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		w := n.WrapPacketConn(name)(pc)
		tb.Cleanup(func() { _ = w.Close() })
		return w
	}
	return open("a"), open("b")
}

// exchange sends count packets a -> b and returns how many arrived
// (a packet "end" marks the end; it is sent unfaulted through raw).
func exchange(tb testing.TB, n *Network, from, to net.PacketConn, count int) int {
	tb.Helper()
	for i := range count {
		if _, err := from.WriteTo([]byte(fmt.Sprint(i)), to.LocalAddr()); err != nil {
			tb.Fatal(err)
		}
	}
	got := 0
	buf := make([]byte, 64)
	for {
		_ = to.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, _, err := to.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return got
			}
			tb.Fatal(err)
		}
		got++
	}
}

func TestPacketConnFaults(t *testing.T) {
	tests := []struct {
		name     string
		fault    func(n *Network)
		min, max int // packets a -> b that arrive, of 200
	}{
		{"healed", func(*Network) {}, 200, 200},
		{"cut", func(n *Network) { n.Cut("a", "b") }, 0, 0},
		{"cut other way", func(n *Network) { n.Cut("b", "a") }, 0, 0},
		{"isolate b", func(n *Network) { n.Isolate("b") }, 0, 0},
		{"isolate c", func(n *Network) { n.Isolate("c") }, 200, 200},
		{"partition", func(n *Network) { n.Partition([]string{"a"}, []string{"b", "c"}) }, 0, 0},
		{"same group", func(n *Network) { n.Partition([]string{"a", "b"}, []string{"c"}) }, 200, 200},
		{"drop all", func(n *Network) { _ = n.Drop("a", "b", 1) }, 0, 0},
		{"drop reverse only", func(n *Network) { _ = n.Drop("b", "a", 1) }, 200, 200},
		{"drop half", func(n *Network) { _ = n.Drop("a", "b", 0.5) }, 60, 140},
		{"heal", func(n *Network) { n.Cut("a", "b"); n.Isolate("a"); _ = n.Drop("a", "b", 1); n.Heal() }, 200, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := New(1)
			a, b := udpPair(t, n)
			tc.fault(n)
			got := exchange(t, n, a, b, 200)
			if got < tc.min || got > tc.max {
				t.Fatalf("%d of 200 packets arrived, want %d..%d", got, tc.min, tc.max)
			}
		})
	}
}

func TestPacketConnReadSideCut(t *testing.T) {
	// A sender that is not wrapped but registered is still cut at the reader.
	n := New(1)
	raw, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	n.Register("raw", raw.LocalAddr().String())
	_, b := udpPair(t, n)
	n.Cut("raw", "b")
	if got := exchange(t, n, raw, b, 20); got != 0 {
		t.Fatalf("%d packets crossed a cut from an unwrapped sender", got)
	}
	n.Heal()
	if got := exchange(t, n, raw, b, 20); got != 20 {
		t.Fatalf("%d of 20 packets after heal", got)
	}
}

func TestPacketConnDelay(t *testing.T) {
	n := New(1)
	a, b := udpPair(t, n)
	const d = 150 * time.Millisecond
	if err := n.Delay("a", "b", d); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := a.WriteTo([]byte("x"), b.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	_ = b.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, _, err := b.ReadFrom(make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < d {
		t.Fatalf("packet arrived after %v, want >= %v", el, d)
	}
}

func TestBadFaults(t *testing.T) {
	n := New(1)
	for _, p := range []float64{-0.1, 1.1} {
		if err := n.Drop("a", "b", p); !errors.Is(err, ErrBadProbability) {
			t.Errorf("Drop(%v) = %v, want ErrBadProbability", p, err)
		}
	}
	if err := n.Delay("a", "b", -time.Second); !errors.Is(err, ErrBadDelay) {
		t.Errorf("Delay(-1s) = %v, want ErrBadDelay", err)
	}
}

// newMember starts a memberlist node whose transport goes through n.
func newMember(tb testing.TB, n *Network, name string) *memberlist.Memberlist {
	tb.Helper()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"}, BindPort: 0, Logger: log.New(io.Discard, "", 0),
	})
	if err != nil {
		tb.Fatal(err)
	}
	c := memberlist.DefaultLocalConfig()
	c.Name = name
	c.BindAddr = "127.0.0.1"
	c.BindPort = nt.GetAutoBindPort()
	c.AdvertisePort = c.BindPort
	c.Transport = n.WrapTransport(name)(nt)
	c.Label = "faultnet-test"
	c.ProbeInterval = 50 * time.Millisecond
	c.ProbeTimeout = 25 * time.Millisecond
	c.GossipInterval = 20 * time.Millisecond
	c.SuspicionMult = 1
	c.PushPullInterval = 200 * time.Millisecond
	c.TCPTimeout = 200 * time.Millisecond
	c.Logger = log.New(io.Discard, "", 0)
	ml, err := memberlist.Create(c)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ml.Shutdown() })
	return ml
}

func aliveOf(ml *memberlist.Memberlist, name string) bool {
	for _, m := range ml.Members() {
		if m.Name == name {
			return m.State == memberlist.StateAlive
		}
	}
	return false
}

func TestMemberlistPair(t *testing.T) {
	n := New(1)
	a := newMember(t, n, "a")
	b := newMember(t, n, "b")
	if _, err := b.Join([]string{a.LocalNode().Address()}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "a and b see each other", func() bool { return aliveOf(a, "b") && aliveOf(b, "a") })

	// A cut refuses streams (Join uses a TCP push-pull) and kills probes.
	n.Cut("a", "b")
	if _, err := b.Join([]string{a.LocalNode().Address()}); err == nil {
		t.Fatal("join across a cut succeeded")
	}
	testutil.WaitFor(t, 10*time.Second, "a and b see each other fail", func() bool { return !aliveOf(a, "b") && !aliveOf(b, "a") })
	dropped, _ := n.Stats()
	if dropped == 0 {
		t.Fatal("no packet counted as dropped during the cut")
	}

	n.Heal()
	if _, err := b.Join([]string{a.LocalNode().Address()}); err != nil {
		t.Fatalf("join after heal: %v", err)
	}
	testutil.WaitFor(t, 5*time.Second, "a and b alive again", func() bool { return aliveOf(a, "b") && aliveOf(b, "a") })
}

func TestStreamCutWhileOpen(t *testing.T) {
	n := New(1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	n.Register("srv", ln.Addr().String())
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	tr := n.WrapTransport("cli")(nt)
	defer tr.Shutdown()
	c, err := tr.DialTimeout(ln.Addr().String(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if sc := <-accepted; sc != nil {
		defer sc.Close()
	}
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatalf("write before cut: %v", err)
	}
	n.Isolate("srv")
	if _, err := c.Write([]byte("hi")); !errors.Is(err, ErrCut) {
		t.Fatalf("write after cut = %v, want ErrCut", err)
	}
	if _, err := tr.DialTimeout(ln.Addr().String(), time.Second); !errors.Is(err, ErrCut) {
		t.Fatalf("dial after cut = %v, want ErrCut", err)
	}
}

func BenchmarkPacketConnWrite(b *testing.B) {
	n := New(1)
	a, c := udpPair(b, n)
	go func() {
		buf := make([]byte, 256)
		for {
			if _, _, err := c.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	msg := make([]byte, 128)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := a.WriteTo(msg, c.LocalAddr()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pkts/s")
}

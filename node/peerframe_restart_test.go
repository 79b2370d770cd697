package node_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
)

// An ask whose reply fits the asker's frames (here 40 bytes below its
// 8 KiB limit) is answered with the reply: a response is sent once as it
// is, so no room is kept for fields a reliable message gets on each send.
func TestAskReplyThatJustFitsTheAskersFrames(t *testing.T) {
	const limit = 8 << 10
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) { c.Transport.MaxFrameSize = limit })
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr()) // 4 MiB frames
	waitAlive(t, []*node.Node{n1, n2}, 2)
	if _, err := n2.Spawn("sized", func(_ context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, err
		}
		k, err := strconv.Atoi(v.GetValue())
		if err != nil {
			return nil, node.Permanent(err)
		}
		return wrapperspb.String(strings.Repeat("r", k)), nil
	}); err != nil {
		t.Fatal(err)
	}
	ask := func(k int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return n1.Ask(ctx, node.Addr("sized", "n2"), wrapperspb.String(strconv.Itoa(k)), new(wrapperspb.StringValue))
	}
	// Learn the encoded size of a reply of 9000 bytes from the refusal.
	const probe = 9000
	err := ask(probe)
	var re *node.RemoteError
	m := regexp.MustCompile(`a message of (\d+) bytes encoded`).FindStringSubmatch(errString(err))
	if !errors.As(err, &re) || m == nil {
		t.Fatalf("Ask of a %d-byte reply = %v, want the refusal naming its size", probe, err)
	}
	n, _ := strconv.Atoi(m[1])
	// Frame = 1 (tag) + 2 (length) + envelope, all lengths staying 2-byte varints.
	k := probe - (n + 3 - (limit - 40))
	if err := ask(k); err != nil {
		t.Fatalf("Ask of a reply whose frame is %d bytes (the asker's limit %d) = %v; want the reply", limit-40, limit, err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// crashHole drops every packet in and out once drop is set: a crash that
// sends no CONNECTION_CLOSE.
type crashHole struct {
	net.PacketConn
	drop atomic.Bool
}

func (b *crashHole) WriteTo(p []byte, addr net.Addr) (int, error) {
	if b.drop.Load() {
		return len(p), nil
	}
	return b.PacketConn.WriteTo(p, addr)
}

func (b *crashHole) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		n, a, err := b.PacketConn.ReadFrom(p)
		if err != nil || !b.drop.Load() {
			return n, a, err
		}
	}
}

// n2 (256 KiB frames) crashes and is restarted in place (same addresses,
// same data dir) with 2 MiB frames. n1's connection to the dead process is
// not closed yet (nothing was sent on it since). A 512 KiB reliable message
// to n2 is healthy: n2 takes it. Even with Outbox.MaxAttempts = 1 it is
// not dead-lettered for the limit the dead process announced: it waits,
// uncounted, until the keep-alives replace that connection.
func TestHealthyMessageAfterRestartInPlaceWithOneAttempt(t *testing.T) {
	restartInPlace(t, func(c *node.Config) {
		c.Outbox.MaxAttempts = 1
		c.Transport.KeepAlivePeriod, c.Transport.MaxIdleTimeout = 10*time.Second, 30*time.Second // fails with the 1 s default too, racing the keepalive
	})
}

// The same with MaxAttempts 3 and fast retries: many sends of the lone
// message within the keep-alive period spend no attempt.
func TestHealthyMessageAfterRestartInPlaceFastRetries(t *testing.T) {
	restartInPlace(t, func(c *node.Config) {
		fastRetries(c)
		c.Transport.KeepAlivePeriod, c.Transport.MaxIdleTimeout = 10*time.Second, 30*time.Second
	})
}

func restartInPlace(t *testing.T, edit func(*node.Config)) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), edit)
	hole := &crashHole{}
	n2 := newNode(t, "n2", filepath.Join(dir, "n2"), func(c *node.Config) {
		c.Transport.MaxFrameSize = 256 << 10
		c.Transport.WrapPacketConn = func(pc net.PacketConn) net.PacketConn { hole.PacketConn = pc; return hole }
	}, n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	to := node.Addr("sink", "n2")
	if out, err := n1.TellReliable(ctxT(t), to, wrapperspb.String("first")); err != nil || out != node.Delivered {
		t.Fatalf("first = %v, %v", out, err)
	}
	gossip, quic := n2.GossipAddr(), n2.QUICAddr()
	hole.drop.Store(true)
	if err := n2.Kill(); err != nil {
		t.Fatal(err)
	}
	// n1 notices the crash (its probes go unanswered): n2 is suspect, not
	// yet dead, so its connection is still open; the packets in flight at
	// the crash are long gone.
	testutil.WaitFor(t, 10*time.Second, "n2 suspect at n1", func() bool {
		for _, m := range n1.Members() {
			if m.Name == "n2" {
				return m.State.String() == "suspect"
			}
		}
		return false
	})
	var s2 sink
	n2b := newNode(t, "n2", filepath.Join(dir, "n2"), func(c *node.Config) {
		c.GossipAddr, c.QUICAddr = gossip, quic
		c.Transport.MaxFrameSize, c.Transport.MaxReadBytes = 2<<20, 16<<20
	})
	if _, err := n2b.Spawn("sink", s2.handler); err != nil {
		t.Fatal(err)
	}
	out, err := n1.TellReliable(ctxT(t), to, wrapperspb.String(strings.Repeat("x", 512<<10)))
	t.Logf("TellReliable of 512 KiB to the restarted n2 (2 MiB frames) = %v, %v", out, err)
	if err != nil || out == node.DeadLettered {
		t.Fatalf("a healthy message dead-lettered: %v, %v; reasons %q", out, err, deadLetterReasons(t, n1))
	}
	testutil.WaitFor(t, 15*time.Second, "the message delivered or dead-lettered", func() bool {
		return len(s2.values()) == 1 || len(deadLetters(t, n1)) > 0
	})
	if dl := deadLetterReasons(t, n1); len(dl) > 0 {
		t.Fatalf("a healthy message (out = %v) dead-lettered: %q", out, dl)
	}
}

// An ask whose handler fails with an error message longer than the asker's
// frames ends at once with an error saying the reply is too large, not at
// its deadline.
func TestAskErrorTooLargeForTheAskersFrames(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) { c.Transport.MaxFrameSize = 8 << 10 })
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	if _, err := n2.Spawn("fails", func(context.Context, *node.Message) (proto.Message, error) {
		return nil, errors.New(strings.Repeat("e", 16<<10))
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := n1.Ask(ctx, node.Addr("fails", "n2"), wrapperspb.String("q"), new(wrapperspb.StringValue))
	var re *node.RemoteError
	if !errors.As(err, &re) || ctx.Err() != nil {
		t.Fatalf("Ask = %.200v (ctx %v); want a RemoteError before the deadline", err, ctx.Err())
	}
}

package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// One producer's pipelined messages to a live recipient arrive in call
// order, once each, also when synchronous sends of the same stream (which
// may make a direct attempt) are interleaved with them; and their Pendings
// resolve in call order.
func TestTellReliableAsyncOrder(t *testing.T) {
	nodes := cluster(t, 2)
	ctx := ctxT(t)
	var s sink
	nodes[1].Spawn("sink", s.handler)
	to := node.Addr("sink", nodes[1].Name())
	const total = 600
	var want []string
	var pendings []*node.Pending
	for i := range total {
		v := fmt.Sprint(i)
		want = append(want, v)
		if i%50 == 49 {
			if _, err := nodes[0].TellReliable(ctx, to, wrapperspb.String(v)); err != nil {
				t.Fatalf("TellReliable(%d) = %v", i, err)
			}
			continue
		}
		p, err := nodes[0].TellReliableAsync(ctx, to, wrapperspb.String(v))
		if err != nil {
			t.Fatalf("TellReliableAsync(%d) = %v", i, err)
		}
		pendings = append(pendings, p)
	}
	// From the last to the first: when one has resolved, the one before
	// it must have too.
	for i := len(pendings) - 1; i >= 0; i-- {
		if out, err := pendings[i].Wait(ctx); err != nil || out != node.Queued {
			t.Fatalf("pending %d = %v, %v; want Queued", i, out, err)
		}
		if i > 0 {
			select {
			case <-pendings[i-1].Done():
			default:
				t.Fatalf("pending %d resolved before pending %d", i, i-1)
			}
		}
	}
	got := s.waitLen(t, total)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("delivered %d messages out of call order or more than once:\n%v", len(got), got)
	}
	testutil.WaitFor(t, 10*time.Second, "outbox empty", func() bool { return nodes[0].Outbox().Stats().Depth == 0 })
	if got := s.values(); len(got) != total {
		t.Fatalf("delivered %d messages, want %d", len(got), total)
	}
}

// Nothing is acknowledged before it is durable: the node is killed right
// after half of the Pendings resolved; every message whose Pending said
// Queued is in the outbox at the next start and is delivered, in order.
func TestTellReliableAsyncDurableAcrossKill(t *testing.T) {
	dir := t.TempDir()
	n1dir, n2dir := filepath.Join(dir, "n1"), filepath.Join(dir, "n2")
	n1 := startNode(t, "n1", n1dir)
	ctx := ctxT(t)
	to := node.Addr("sink", "n2") // n2 is not running: everything waits in n1's outbox
	const total = 2000
	pendings := make([]*node.Pending, total)
	for i := range pendings {
		p, err := n1.TellReliableAsync(ctx, to, wrapperspb.String(fmt.Sprint(i)))
		if err != nil {
			t.Fatalf("TellReliableAsync(%d) = %v", i, err)
		}
		pendings[i] = p
	}
	if out, err := pendings[total/2].Wait(ctx); err != nil || out != node.Queued {
		t.Fatalf("pending %d = %v, %v", total/2, out, err)
	}
	if err := n1.Kill(); err != nil {
		t.Fatal(err)
	}
	var acked []string
	for i, p := range pendings {
		out, err := p.Wait(ctx) // the store commits or fails what it was handed before it closed
		switch {
		case err == nil && out == node.Queued:
			acked = append(acked, fmt.Sprint(i))
		case err == nil:
			t.Fatalf("pending %d = %v, want Queued or an error", i, out)
		case !errors.Is(err, node.ErrClosed):
			t.Fatalf("pending %d failed with %v, want ErrClosed", i, err)
		}
	}
	if len(acked) <= total/2 {
		t.Fatalf("%d pendings resolved Queued, want more than %d", len(acked), total/2)
	}
	n1 = startNode(t, "n1", n1dir)
	if d := n1.Outbox().Stats().Depth; d < len(acked) {
		t.Fatalf("depth after the restart = %d, but %d messages were acknowledged", d, len(acked))
	}
	var s sink
	n2 := startNode(t, "n2", n2dir, n1.GossipAddr())
	n2.Spawn("sink", s.handler)
	testutil.WaitFor(t, 15*time.Second, "outbox drained", func() bool { return n1.Outbox().Stats().Depth == 0 })
	got := s.values()
	seen := make(map[string]bool, len(got))
	for _, v := range got {
		if seen[v] {
			t.Fatalf("%s delivered twice", v)
		}
		seen[v] = true
	}
	for _, v := range acked {
		if !seen[v] {
			t.Fatalf("acknowledged message %s was lost", v)
		}
	}
	if strings.Join(got[:len(acked)], ",") != strings.Join(acked, ",") {
		t.Fatalf("delivered out of order: %v", got)
	}
}

// What is known at the call is returned at the call, and nothing is stored.
func TestTellReliableAsyncRefusals(t *testing.T) {
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.Transport.MaxFrameSize = 4096 })
	ctx := ctxT(t)
	to := node.Addr("sink", "n2")
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		to   node.Address
		msg  proto.Message
		opts []node.SendOption
		want error
	}{
		{"too large", ctx, to, wrapperspb.String(strings.Repeat("X", 8192)), nil, node.ErrTooLarge},
		{"negative TTL", ctx, to, wrapperspb.String("x"), []node.SendOption{node.WithTTL(-time.Second)}, node.ErrBadOption},
		{"key too long", ctx, to, wrapperspb.String("x"), []node.SendOption{node.WithIdempotencyKey(strings.Repeat("k", node.MaxIdempotencyKey+1))}, node.ErrBadKey},
		{"context done", canceled, to, wrapperspb.String("x"), nil, context.Canceled},
		{"no node", ctx, node.Address{Actor: "sink"}, wrapperspb.String("x"), nil, node.ErrBadAddress},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := n.TellReliableAsync(tc.ctx, tc.to, tc.msg, tc.opts...)
			if !errors.Is(err, tc.want) || p != nil {
				t.Fatalf("TellReliableAsync = %v, %v; want nil, %v", p, err, tc.want)
			}
		})
	}
	if d := n.Outbox().Stats().Depth; d != 0 {
		t.Fatalf("outbox depth %d, want 0", d)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.TellReliableAsync(ctx, to, wrapperspb.String("x")); !errors.Is(err, node.ErrClosed) {
		t.Fatalf("TellReliableAsync after Close = %v, want ErrClosed", err)
	}
}

// Client interceptors see the call as CallReliableAsync and can set
// headers that travel with the stored message.
func TestTellReliableAsyncInterceptor(t *testing.T) {
	var mu sync.Mutex
	var kinds []node.CallKind
	ic := func(ctx context.Context, c *node.Call, next node.Invoker) error {
		mu.Lock()
		kinds = append(kinds, c.Kind)
		mu.Unlock()
		c.SetHeader("trace", "t1")
		return next(ctx, c)
	}
	n1 := newNode(t, "n1", filepath.Join(t.TempDir(), "n1"), func(c *node.Config) {
		c.ClientInterceptors = []node.ClientInterceptor{ic}
	})
	n2 := startNode(t, "n2", filepath.Join(t.TempDir(), "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	got := make(chan string, 1)
	n2.Spawn("h", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		got <- m.Headers()["trace"]
		return nil, nil
	})
	p, err := n1.TellReliableAsync(ctxT(t), node.Addr("h", "n2"), wrapperspb.String("x"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := p.Wait(ctxT(t)); err != nil || out != node.Queued {
		t.Fatalf("pending = %v, %v", out, err)
	}
	select {
	case h := <-got:
		if h != "t1" {
			t.Fatalf("header = %q, want t1", h)
		}
	case <-ctxT(t).Done():
		t.Fatal("message not delivered")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kinds) != 1 || kinds[0] != node.CallReliableAsync {
		t.Fatalf("interceptor saw %v, want [reliable-async]", kinds)
	}
}

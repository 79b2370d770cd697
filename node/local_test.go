package node_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestParseAddress(t *testing.T) {
	tests := []struct {
		in      string
		want    node.Address
		wantErr bool
	}{
		{"worker@n1", node.Addr("worker", "n1"), false},
		{"a.b-c@node-7", node.Addr("a.b-c", "node-7"), false},
		{"worker", node.Address{}, true},
		{"@n1", node.Address{}, true},
		{"worker@", node.Address{}, true},
		{"a@b@c", node.Address{}, true},
		{"wor ker@n1", node.Address{}, true},
		{"", node.Address{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := node.ParseAddress(tt.in)
			if tt.wantErr {
				if !errors.Is(err, node.ErrBadAddress) {
					t.Fatalf("ParseAddress(%q) err = %v, want ErrBadAddress", tt.in, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseAddress(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
			if got.String() != tt.in {
				t.Fatalf("String() = %q, want %q", got.String(), tt.in)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	good := testConfig(t, "n1", t.TempDir())
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	tests := []struct {
		name string
		mut  func(*node.Config)
		want string
	}{
		{"empty name", func(c *node.Config) { c.Name = "" }, "name"},
		{"no data dir", func(c *node.Config) { c.DataDir = "" }, "data directory"},
		{"bad gossip addr", func(c *node.Config) { c.GossipAddr = "nope" }, "gossip address"},
		{"short key", func(c *node.Config) { c.GossipKey = []byte("short") }, "32"},
		{"no tls", func(c *node.Config) { c.TLS.Roots = nil }, "TLS"},
		{"cert for other node", func(c *node.Config) { c.Name = "other" }, "certificate is for"},
		{"zero capacity", func(c *node.Config) { c.MailboxCapacity = 0 }, "capacity"},
		{"zero ask response TTL", func(c *node.Config) { c.AskResponseTTL = 0 }, "response TTL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.mut(&c)
			err := c.Validate()
			if !errors.Is(err, node.ErrBadConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want ErrBadConfig mentioning %q", err, tt.want)
			}
			if _, err := node.New(c); !errors.Is(err, node.ErrBadConfig) {
				t.Fatalf("New() = %v, want ErrBadConfig", err)
			}
		})
	}
}

func echo(ctx context.Context, m *node.Message) (proto.Message, error) {
	var s wrapperspb.StringValue
	if err := m.Decode(&s); err != nil {
		return nil, err
	}
	return wrapperspb.String("echo:" + s.GetValue()), nil
}

func TestLocalTellAndAsk(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	ctx := ctxT(t)
	got := make(chan string, 1)
	if _, err := n.Spawn("sink", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var s wrapperspb.StringValue
		if err := m.Decode(&s); err != nil {
			return nil, err
		}
		got <- s.GetValue()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	addr, err := n.Spawn("echo", echo)
	if err != nil {
		t.Fatal(err)
	}
	if addr.String() != "echo@n1" {
		t.Fatalf("Spawn address = %s", addr)
	}
	if _, err := n.Spawn("echo", echo); !errors.Is(err, node.ErrActorExists) {
		t.Fatalf("second Spawn = %v, want ErrActorExists", err)
	}
	if err := n.Tell(ctx, node.Addr("sink", "n1"), wrapperspb.String("hi")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; v != "hi" {
		t.Fatalf("sink got %q", v)
	}
	var resp wrapperspb.StringValue
	if err := n.Ask(ctx, addr, wrapperspb.String("x"), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.GetValue() != "echo:x" {
		t.Fatalf("Ask reply = %q", resp.GetValue())
	}
	if err := n.Tell(ctx, node.Addr("ghost", "n1"), wrapperspb.String("x")); !errors.Is(err, node.ErrNoSuchActor) {
		t.Fatalf("Tell to missing actor = %v, want ErrNoSuchActor", err)
	}
	if err := n.Ask(ctx, node.Addr("ghost", "n1"), wrapperspb.String("x"), &resp); !errors.Is(err, node.ErrNoSuchActor) {
		t.Fatalf("Ask to missing actor = %v, want ErrNoSuchActor", err)
	}
}

func TestLocalHandlerErrorsAndPanics(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	ctx := ctxT(t)
	errBoom := errors.New("boom")
	n.Spawn("fail", func(ctx context.Context, m *node.Message) (proto.Message, error) { return nil, errBoom })
	n.Spawn("panic", func(ctx context.Context, m *node.Message) (proto.Message, error) { panic("kaboom") })
	if err := n.Ask(ctx, node.Addr("fail", "n1"), wrapperspb.String("x"), nil); !errors.Is(err, errBoom) {
		t.Fatalf("Ask to failing handler = %v, want errBoom", err)
	}
	err := n.Ask(ctx, node.Addr("panic", "n1"), wrapperspb.String("x"), nil)
	if err == nil || !node.IsPermanent(err) || !strings.Contains(err.Error(), "kaboom") {
		t.Fatalf("Ask to panicking handler = %v, want a permanent error naming the panic", err)
	}
	if got := n.Stats().Panics; got != 1 {
		t.Fatalf("Panics = %d, want 1", got)
	}
	// The actor survives its panic.
	err = n.Ask(ctx, node.Addr("panic", "n1"), wrapperspb.String("x"), nil)
	if err == nil || n.Stats().Panics != 2 {
		t.Fatalf("second panic: err=%v panics=%d", err, n.Stats().Panics)
	}
}

func TestLocalSequentialUnderConcurrentSenders(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	ctx := ctxT(t)
	const senders, each = 8, 500
	var running, overlaps atomic.Int32
	var mu sync.Mutex
	last := map[string]int{}
	var outOfOrder, total atomic.Int32
	n.Spawn("seq", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		if running.Add(1) != 1 {
			overlaps.Add(1)
		}
		defer running.Add(-1)
		var s wrapperspb.StringValue
		if err := m.Decode(&s); err != nil {
			return nil, err
		}
		var who string
		var i int
		fmt.Sscanf(s.GetValue(), "%s %d", &who, &i)
		mu.Lock()
		if prev, ok := last[who]; ok && i != prev+1 {
			outOfOrder.Add(1)
		}
		last[who] = i
		mu.Unlock()
		total.Add(1)
		return nil, nil
	}, node.WithMailbox(senders*each, mailbox.Reject))
	var wg sync.WaitGroup
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if err := n.Tell(ctx, node.Addr("seq", "n1"), wrapperspb.String(fmt.Sprintf("s%d %d", s, i))); err != nil {
					t.Errorf("tell: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	testutil.WaitFor(t, 10*time.Second, "all processed", func() bool { return total.Load() == senders*each })
	if overlaps.Load() != 0 || outOfOrder.Load() != 0 {
		t.Fatalf("overlaps=%d outOfOrder=%d, want 0 and 0", overlaps.Load(), outOfOrder.Load())
	}
}

func TestLocalMailboxFull(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	ctx := ctxT(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	started := make(chan struct{}, 1)
	n.Spawn("slow", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		return nil, nil
	}, node.WithMailbox(2, mailbox.Reject))
	to := node.Addr("slow", "n1")
	if err := n.Tell(ctx, to, wrapperspb.String("0")); err != nil {
		t.Fatal(err)
	}
	<-started // the handler holds message 0; the mailbox has room for 2 more
	for i := 1; i <= 2; i++ {
		if err := n.Tell(ctx, to, wrapperspb.String("x")); err != nil {
			t.Fatalf("tell %d: %v", i, err)
		}
	}
	err := n.Tell(ctx, to, wrapperspb.String("overflow"))
	var ce *node.CapacityError
	if !errors.As(err, &ce) || !errors.Is(err, node.ErrMailboxFull) || ce.RetryAfter <= 0 {
		t.Fatalf("Tell to full mailbox = %v, want *CapacityError with RetryAfter > 0", err)
	}
	err = n.Ask(ctx, to, wrapperspb.String("overflow"), nil)
	if !errors.As(err, &ce) {
		t.Fatalf("Ask to full mailbox = %v, want *CapacityError", err)
	}
}

func TestLocalAskTimeoutAndCancel(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	release := make(chan struct{})
	n.Spawn("stuck", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		<-release
		return wrapperspb.String("late"), nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := n.Ask(ctx, node.Addr("stuck", "n1"), wrapperspb.String("x"), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ask past deadline = %v, want DeadlineExceeded", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Ask(ctx2, node.Addr("stuck", "n1"), wrapperspb.String("y"), nil) }()
	cancel2()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Ask = %v, want Canceled", err)
	}
	close(release) // the late replies go to buffered channels nobody reads: no goroutine stays (goleak)
}

func TestClosedNode(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	ctx := ctxT(t)
	if err := n.Tell(ctx, node.Addr("a", "n1"), wrapperspb.String("x")); !errors.Is(err, node.ErrClosed) {
		t.Fatalf("Tell after Close = %v", err)
	}
	if _, err := n.TellReliable(ctx, node.Addr("a", "n1"), wrapperspb.String("x")); !errors.Is(err, node.ErrClosed) {
		t.Fatalf("TellReliable after Close = %v", err)
	}
	if _, err := n.Spawn("a", echo); !errors.Is(err, node.ErrClosed) {
		t.Fatalf("Spawn after Close = %v", err)
	}
}

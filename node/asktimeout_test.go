package node_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A remote Ask whose context has no deadline ends at AskTimeout with
// context.DeadlineExceeded, its handler sees that deadline, a cancelled
// context still ends it, and asks one after another (which reuse the
// timer when AskTimeout is at least twice the transport's
// HandshakeTimeout) each get their own reply.
func TestRemoteAskWithoutDeadline(t *testing.T) {
	for _, tc := range []struct {
		name      string
		handshake time.Duration
	}{
		{"timer (AskTimeout >= 2 × HandshakeTimeout)", 200 * time.Millisecond},
		{"context (AskTimeout < 2 × HandshakeTimeout)", 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const askTimeout = 400 * time.Millisecond
			nodes := clusterWith(t, 2, func(i int, cfg *node.Config) {
				if i == 0 {
					cfg.AskTimeout, cfg.Transport.HandshakeTimeout = askTimeout, tc.handshake
				}
			})
			release := make(chan struct{})
			defer close(release)
			var sawDeadline atomic.Bool
			stuck, err := nodes[1].Spawn("stuck", func(ctx context.Context, m *node.Message) (proto.Message, error) {
				_, ok := ctx.Deadline()
				sawDeadline.Store(ok)
				<-release
				return nil, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			echo, err := nodes[1].Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) {
				return m.Body()
			})
			if err != nil {
				t.Fatal(err)
			}

			start := time.Now()
			err = nodes[0].Ask(context.Background(), stuck, wrapperspb.String("x"), nil)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Ask to a handler that never answers = %v, want DeadlineExceeded", err)
			}
			if took := time.Since(start); took < askTimeout-20*time.Millisecond {
				t.Fatalf("Ask gave up after %v, before AskTimeout %v", took, askTimeout)
			}
			if !sawDeadline.Load() {
				t.Fatal("the handler's context had no deadline: AskTimeout did not travel")
			}

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- nodes[0].Ask(ctx, stuck, wrapperspb.String("y"), nil) }()
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Ask = %v, want Canceled", err)
			}

			for i := range 50 {
				want := fmt.Sprintf("m%d", i)
				var got wrapperspb.StringValue
				if err := nodes[0].Ask(context.Background(), echo, wrapperspb.String(want), &got); err != nil {
					t.Fatalf("ask %d: %v", i, err)
				}
				if got.GetValue() != want {
					t.Fatalf("ask %d answered %q, want %q", i, got.GetValue(), want)
				}
			}
		})
	}
}

// An ask still waiting when the response registry prunes its waiter
// (AskResponseTTL) fails with DeadlineExceeded: it is not a success
// without a reply.
func TestAskOutlivingTheResponseTTLFails(t *testing.T) {
	nodes := clusterWith(t, 2, func(i int, cfg *node.Config) {
		cfg.AskResponseTTL = 20 * time.Millisecond
	})
	ctx := ctxT(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	if _, err := nodes[1].Spawn("stuck", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, errors.New("too late")
	}); err != nil {
		t.Fatal(err)
	}
	long, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	to := node.Addr("stuck", nodes[1].Name())
	for _, resp := range []proto.Message{nil, &wrapperspb.StringValue{}} {
		err := nodes[0].Ask(long, to, wrapperspb.String("q"), resp)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "AskResponseTTL") {
			t.Fatalf("Ask (reply into %T) = %v, want DeadlineExceeded naming AskResponseTTL", resp, err)
		}
	}
}

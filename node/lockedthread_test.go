package node_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/meshnode/meshnode/node"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A handler that moves its OS thread into another network namespace and
// leaves it locked (the thread then ends with the goroutine: the promise
// of runtime.LockOSThread, and how a program throws away a thread it
// cannot switch back) moves no other actor: each run of an idle actor
// is a goroutine of its own, so the next actor's handler runs in the
// node's namespace and reaches a loopback listener beside it. A node
// that kept its actors' goroutines for the next actor to start handed
// on the moved thread, and this failed on the first ask.
func TestAHandlersLockedThreadNeverRunsAnotherActor(t *testing.T) {
	n, err := node.Open(testConfig(t, "n1", t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Close() }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()

	mover, err := n.Spawn("mover", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			return wrapperspb.String("unshare: " + err.Error()), nil
		}
		return wrapperspb.String(""), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	dialer, err := n.Spawn("dialer", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
		if err != nil {
			return wrapperspb.String(err.Error()), nil
		}
		_ = c.Close()
		return wrapperspb.String(""), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var resp wrapperspb.StringValue
	if err := n.Ask(ctx, mover, wrapperspb.String("move"), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Value != "" {
		t.Skipf("cannot make a network namespace here: %s", resp.Value)
	}
	// The mover's mailbox is idle once its reply is out, and its
	// goroutine ends with its thread. Each ask below starts the dialer
	// anew.
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; time.Now().Before(deadline) && i < 50; i++ {
		if err := n.Ask(ctx, dialer, wrapperspb.String("dial"), &resp); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		if resp.Value != "" {
			t.Fatalf("ask %d: the dialer actor's handler cannot reach 127.0.0.1 on its own node: %s", i, resp.Value)
		}
	}
}

package node_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/testnet"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Two versions of one coalesce key in the dead-letter queue, both refused
// on Send's direct attempt (so never queued): replaying them all runs the
// newest and leaves the older one in the queue as superseded. A version
// dead-lettered that way is noted in the coalesce index as a queued one
// is; before, it was not, Replay took the older first, gave it a new (and
// higher) sequence that the index recorded, and then refused the newer as
// superseded by it, now and on every later Replay: the older version won.
func TestReplayOfEveryDeadLetteredVersionRunsTheNewest(t *testing.T) {
	const a, cc = 0, 1
	var (
		mu     sync.Mutex
		ran    []string
		reject = true
	)
	c := testnet.New(t, 2, testnet.WithSpawn(func(_ int, nd *node.Node) error {
		_, err := nd.Spawn("cfg", func(_ context.Context, m *node.Message) (proto.Message, error) {
			var v wrapperspb.StringValue
			if err := m.Decode(&v); err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			if reject {
				return nil, node.Permanent(errors.New("config service not ready"))
			}
			ran = append(ran, v.GetValue())
			return nil, nil
		})
		return err
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	to := c.Addr("cfg", cc)
	for _, v := range []string{"v1", "v2"} {
		out, err := c.Node(a).TellReliable(ctx, to, wrapperspb.String(v), node.WithOverwrite("config"))
		if err != nil || out != node.DeadLettered {
			t.Fatalf("%s: %v %v, want DeadLettered", v, out, err)
		}
	}
	mu.Lock()
	reject = false
	mu.Unlock()
	n, err := c.Node(a).Outbox().Replay(outbox.DLQFilter{Recipient: to.String()})
	t.Logf("replay: %d %v", n, err)
	if n > 0 {
		testutil.WaitFor(t, 10*time.Second, "the replay ran", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(ran) >= n
		})
		if err := c.WaitDrained(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	got := slices.Clone(ran)
	mu.Unlock()
	if !slices.Equal(got, []string{"v2"}) {
		t.Fatalf("after replaying both dead-lettered versions of coalesce key \"config\", cfg ran %v, want [v2]", got)
	}
	dl, err := c.Node(a).Outbox().DeadLetters(outbox.DLQFilter{Recipient: to.String()})
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead letters left: %v (%v), want v1's alone", dl, err)
	}
	if n, err := c.Node(a).Outbox().Replay(outbox.DLQFilter{Recipient: to.String()}); n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replaying v1 after v2: %d, %v; want 0 and ErrSuperseded", n, err)
	}
}

// Replay of an older version's dead letter while Send's direct attempt of
// a newer version is running: the newer version was noted in the coalesce
// index before its attempt, so the older one is refused (ErrSuperseded)
// and never runs after the newer one. Before, the newer version was noted
// only once delivered, the older one was taken back at a sequence above
// it, and ran after it.
func TestReplayDuringANewerVersionsDirectAttemptIsRefused(t *testing.T) {
	const a, cc = 0, 1
	var (
		mu      sync.Mutex
		ran     []string
		v1Seen  bool
		inV2    = make(chan struct{})
		v2Leave = make(chan struct{})
	)
	c := testnet.New(t, 2, testnet.WithSpawn(func(_ int, nd *node.Node) error {
		_, err := nd.Spawn("cfg", func(_ context.Context, m *node.Message) (proto.Message, error) {
			var v wrapperspb.StringValue
			if err := m.Decode(&v); err != nil {
				return nil, err
			}
			mu.Lock()
			if v.GetValue() == "v1" && !v1Seen {
				v1Seen = true
				mu.Unlock()
				return nil, node.Permanent(errors.New("config service not ready"))
			}
			mu.Unlock()
			if v.GetValue() == "v2" {
				close(inV2)
				<-v2Leave // the handler takes a while
			}
			mu.Lock()
			ran = append(ran, v.GetValue())
			mu.Unlock()
			return nil, nil
		})
		return err
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	to := c.Addr("cfg", cc)
	out, err := c.Node(a).TellReliable(ctx, to, wrapperspb.String("v1"), node.WithOverwrite("config"))
	if err != nil || out != node.DeadLettered {
		t.Fatalf("v1: %v %v, want DeadLettered", out, err)
	}
	type result struct {
		out node.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := c.Node(a).TellReliable(ctx, to, wrapperspb.String("v2"), node.WithOverwrite("config"))
		done <- result{out, err}
	}()
	<-inV2 // v2's direct attempt is running at C
	n, err := c.Node(a).Outbox().Replay(outbox.DLQFilter{Recipient: to.String()})
	close(v2Leave)
	r := <-done
	if n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replaying v1 while v2's direct attempt runs: %d, %v; want 0 and ErrSuperseded", n, err)
	}
	if r.err != nil || r.out != node.Delivered {
		t.Fatalf("v2: %v %v, want Delivered", r.out, r.err)
	}
	mu.Lock()
	got := slices.Clone(ran)
	mu.Unlock()
	if !slices.Equal(got, []string{"v2"}) {
		t.Fatalf("cfg ran %v, want [v2]", got)
	}
}

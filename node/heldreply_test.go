package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// replyScenario: n0 sends a reliable request to n1's "svc" (replies to
// n0's "rx"); n1's disk refuses writes, so the reply the handler made
// cannot be stored. The request is resent several times while the disk
// stays full; then the disk takes writes again. svc's handler returns
// handlerErr (nil for a reply, a permanent error for an error reply).
// It returns the handler's runs and what rx received.
func replyScenario(t *testing.T, handlerErr error) (runs int64, got []string) {
	dirs := [2]string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
	n0 := startNode(t, "n0", dirs[0])
	n1 := startNode(t, "n1", dirs[1], n0.GossipAddr())
	waitAlive(t, []*node.Node{n0, n1}, 2)
	var ran atomic.Int64
	svc, err := n1.Spawn("svc", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		ran.Add(1)
		return wrapperspb.String("charged"), handlerErr
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var replies []string
	if _, err := n0.Spawn("rx", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		if m.ReplyError() != nil {
			replies = append(replies, "error")
			return nil, nil
		}
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, node.Permanent(err)
		}
		replies = append(replies, v.GetValue())
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	restore, hits := faults.FailCommits(filepath.Join(dirs[1], "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()

	if _, err := n0.TellReliable(ctxT(t), svc, wrapperspb.String("charge 7"), node.WithReplyTo(node.Addr("rx", "n0"))); err != nil {
		t.Fatal(err)
	}
	// The first copy runs the handler and meets the full disk; each resend
	// (about a second apart) meets it again.
	testutil.WaitFor(t, 30*time.Second, "three copies of the request to meet the full disk", func() bool { return hits() >= 3 })
	if r := ran.Load(); r != 1 {
		t.Errorf("while the responder's disk refused its reply, the handler ran %d times, want once", r)
	}
	restore()
	testutil.WaitFor(t, 30*time.Second, "the reply at the requester and both outboxes empty", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(replies) > 0 && n0.Outbox().Stats().Depth == 0 && n1.Outbox().Stats().Depth == 0
	})
	mu.Lock()
	defer mu.Unlock()
	return ran.Load(), append([]string(nil), replies...)
}

// A reliable request's handler ran, but the responder's disk refused to
// store its reply. Running the handler again on every resend until the
// disk takes a reply repeats its effects (a charge made once per second);
// the reply it made is kept and stored when the disk allows.
func TestReplyTheDiskRefusedIsNotMadeAgain(t *testing.T) {
	runs, got := replyScenario(t, nil)
	if runs != 1 || len(got) != 1 || got[0] != "charged" {
		t.Fatalf("handler ran %d times, requester got %q; want once and [charged]", runs, got)
	}
}

// The same for a handler's permanent error, which comes back as an error
// reply.
func TestErrorReplyTheDiskRefusedIsNotMadeAgain(t *testing.T) {
	runs, got := replyScenario(t, node.Permanent(errors.New("card declined")))
	if runs != 1 || len(got) != 1 || got[0] != "error" {
		t.Fatalf("handler ran %d times, requester got %q; want once and [error]", runs, got)
	}
}

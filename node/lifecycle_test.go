package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// worker counts the tells and reliable messages it ran, by value; until
// gate is closed it waits (or gives up when its context ends).
type worker struct {
	gate chan struct{}

	mu       sync.Mutex
	tells    map[string]int
	reliable map[string]int
}

func newWorker() *worker {
	return &worker{gate: make(chan struct{}), tells: map[string]int{}, reliable: map[string]int{}}
}

func (w *worker) handle(ctx context.Context, m *node.Message) (proto.Message, error) {
	select {
	case <-w.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var v wrapperspb.StringValue
	if err := m.Decode(&v); err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if m.Sequence() > 0 {
		w.reliable[v.GetValue()]++
	} else {
		w.tells[v.GetValue()]++
	}
	return nil, nil
}

func (w *worker) counts() (tells, reliable int, dup bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.tells {
		tells += c
		dup = dup || c > 1
	}
	for _, c := range w.reliable {
		reliable++
		dup = dup || c > 1
	}
	return tells, reliable, dup
}

const (
	shutdownTells    = 30
	shutdownReliable = 10
)

// loadWorker starts n1 (with the worker) and n2, fills n1's mailbox with
// local tells while the worker waits, and has n2 dispatch reliable
// messages to it. It returns n1's data directory and n2.
func loadWorker(t *testing.T, w *worker) (n1 *node.Node, dir1 string, n2 *node.Node) {
	t.Helper()
	dir1 = filepath.Join(t.TempDir(), "n1")
	n1 = startNode(t, "n1", dir1)
	n2 = startNode(t, "n2", t.TempDir(), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	if _, err := n1.Spawn("work", w.handle, node.WithMailbox(100, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	to := node.Addr("work", "n1")
	for i := range shutdownTells {
		if err := n1.Tell(ctx, to, wrapperspb.String(string(rune('A'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range shutdownReliable {
		if res, err := n2.Dispatch(ctx, []node.Address{to}, wrapperspb.String(string(rune('a'+i)))); err != nil || res.Accepted != 1 {
			t.Fatalf("dispatch: %v %v", res, err)
		}
	}
	// One tell runs (and waits); the other tells and at least one reliable
	// message (a stream's first emission) wait in the mailbox.
	testutil.WaitFor(t, 10*time.Second, "a reliable message waits in n1's mailbox", func() bool {
		for _, s := range n1.ActorStats() {
			if s.Name == "work" {
				return s.Running && s.Depth >= shutdownTells
			}
		}
		return false
	})
	return n1, dir1, n2
}

// finish restarts n1 with a fresh worker that runs at once, waits until
// n2 has nothing left for it, and returns that worker.
func finish(t *testing.T, dir1 string, n2 *node.Node) *worker {
	t.Helper()
	w := newWorker()
	close(w.gate)
	n1 := startNodeWith(t, "n1", dir1, func(cfg *node.Config) {}, n2.GossipAddr())
	if _, err := n1.Spawn("work", w.handle); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "n2's outbox empty", func() bool { return n2.Outbox().Stats().Depth == 0 })
	return w
}

// TestShutdownDrainsMailboxes: Shutdown runs every tell and reliable
// message that was in a mailbox; the reliable messages still at their
// sender run after the restart; none runs twice and nothing is dropped.
func TestShutdownDrainsMailboxes(t *testing.T) {
	w := newWorker()
	n1, dir1, n2 := loadWorker(t, w)
	done := make(chan error, 1)
	go func() { done <- n1.Shutdown(ctxT(t)) }()
	probes := 0
	testutil.WaitFor(t, 5*time.Second, "spawn refused while draining", func() bool {
		probes++
		_, err := n1.Spawn(fmt.Sprintf("probe-%d", probes), echo)
		return errors.Is(err, node.ErrClosed)
	})
	if err := n1.Tell(context.Background(), node.Addr("work", "n1"), wrapperspb.String("late")); !errors.Is(err, node.ErrClosed) {
		t.Fatalf("local tell while draining: %v, want ErrClosed", err)
	}
	close(w.gate)
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	tells, before, dup := w.counts()
	if tells != shutdownTells || dup {
		t.Fatalf("ran %d tells (duplicates: %v), want each of %d once", tells, dup, shutdownTells)
	}
	if d := n1.Stats().Dropped; d != 0 {
		t.Fatalf("Stats.Dropped = %d after a drained shutdown", d)
	}
	after := finish(t, dir1, n2)
	_, rest, dup2 := after.counts()
	if before+rest != shutdownReliable || dup2 {
		t.Fatalf("reliable: %d before the shutdown + %d after = %d, want %d exactly once", before, rest, before+rest, shutdownReliable)
	}
}

// TestShutdownBoundedByContext: when ctx ends before the mailboxes drain,
// Shutdown closes anyway and says so; every tell either ran or is counted
// as dropped, and every reliable message runs once after the restart.
func TestShutdownBoundedByContext(t *testing.T) {
	w := newWorker()
	n1, dir1, n2 := loadWorker(t, w)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := n1.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want the context's deadline", err)
	}
	tells, _, _ := w.counts()
	st := n1.Stats()
	// The tell being handled when the node closed ran (its handler saw its
	// context end): it counts as neither handled above nor dropped. Dropped
	// also counts reliable messages still queued at the close (they run
	// after the restart, checked below).
	if got := uint64(tells) + st.Dropped; got < shutdownTells-1 || got > shutdownTells+shutdownReliable {
		t.Fatalf("tells: %d handled + %d dropped = %d, want %d (or one less: the one running; or more: reliable messages dropped)", tells, st.Dropped, got, shutdownTells)
	}
	after := finish(t, dir1, n2)
	_, rest, dup := after.counts()
	if rest != shutdownReliable || dup {
		t.Fatalf("reliable after the restart: %d (duplicates: %v), want %d once", rest, dup, shutdownReliable)
	}
}

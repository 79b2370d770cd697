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
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/node"
)

// eventLog records membership events by "kind peer".
type eventLog struct {
	mu  sync.Mutex
	got []string
}

func (l *eventLog) add(kind mesh.EventKind, peer string) {
	l.mu.Lock()
	l.got = append(l.got, kind.String()+" "+peer)
	l.mu.Unlock()
}

func (l *eventLog) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, g := range l.got {
		if g == s {
			return true
		}
	}
	return false
}

// waitEvent waits until l has the event s.
func waitEvent(t *testing.T, l *eventLog, who, s string) {
	t.Helper()
	if !l.has(s) {
		t.Cleanup(func() {
			if t.Failed() {
				l.mu.Lock()
				defer l.mu.Unlock()
				t.Logf("%s: events seen: %v", who, l.got)
			}
		})
	}
	testutil.WaitFor(t, 20*time.Second, fmt.Sprintf("%s: a %q event", who, s), func() bool { return l.has(s) })
}

// TestMemberEvents: join, update (tags), leave, dead and restart reach the
// application's own Config.Mesh.OnEvent callback and a MemberEvents
// subscriber, with the member's tags.
func TestMemberEvents(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	var callback, channel eventLog
	n1 := startNodeWith(t, "n1", t.TempDir(), func(cfg *node.Config) {
		cfg.Mesh.OnEvent = func(ev mesh.Event) { callback.add(ev.Kind, ev.Member.Name) }
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := n1.MemberEvents(ctx, 64)
	var wg sync.WaitGroup
	wg.Go(func() {
		for ev := range ch {
			channel.add(ev.Kind, ev.Member.Name)
			if ev.Kind == node.MemberUpdate && ev.Member.Tags["zone"] == "b" {
				channel.add(ev.Kind, ev.Member.Name+" zone=b")
			}
		}
	})
	join := n1.GossipAddr()
	n2 := startNodeWith(t, "n2", t.TempDir(), func(cfg *node.Config) { cfg.Tags = map[string]string{"zone": "a"} }, join)
	dir3 := filepath.Join(t.TempDir(), "n3")
	n3 := startNode(t, "n3", dir3, join)
	for _, l := range []*eventLog{&callback, &channel} {
		waitEvent(t, l, "join", "join n2")
		waitEvent(t, l, "join", "join n3")
	}
	if err := n2.SetTags(map[string]string{"zone": "b"}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, &channel, "update", "update n2 zone=b")
	waitEvent(t, &callback, "update", "update n2")
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n3.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*eventLog{&callback, &channel} {
		waitEvent(t, l, "leave", "left n2")
		waitEvent(t, l, "dead", "dead n3")
	}
	startNode(t, "n3", dir3, join)
	for _, l := range []*eventLog{&callback, &channel} {
		waitEvent(t, l, "restart", "restart n3")
	}
	cancel()
	wg.Wait() // the channel is closed with its context
}

// TestStuckMemberCallbackBreaksNothing: an application callback that never
// returns stops neither the node's own reaction to membership (a dead
// peer's ask fails at once) nor subscribers, and it does not hang Close.
func TestStuckMemberCallbackBreaksNothing(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	n1 := startNodeWith(t, "n1", t.TempDir(), func(cfg *node.Config) {
		cfg.Mesh.OnEvent = func(mesh.Event) { <-release }
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := n1.MemberEvents(ctx, 1) // and a subscriber that never keeps up
	n2 := startNode(t, "n2", t.TempDir(), n1.GossipAddr())
	n3 := startNode(t, "n3", t.TempDir(), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2, n3}, 3)
	if err := n3.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n1 sees n3 down", func() bool {
		for _, m := range n1.Members() {
			if m.Name == "n3" {
				return m.State == mesh.StateDead
			}
		}
		return false
	})
	// At once: the answer comes from membership, not from the ask's deadline.
	err := n1.Ask(ctxT(t), node.Addr("a", "n3"), nil, nil)
	if !errors.Is(err, node.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ask to a dead peer: %v, want ErrUnreachable", err)
	}
	if n1.Stats().MemberEventsMissed == 0 {
		t.Fatal("no missed event counted for the stuck callback and the slow subscriber")
	}
	// The subscriber's buffer of one kept the first event and lost the
	// others; its next event says how many.
	if ev := <-ch; ev.Missed != 0 {
		t.Fatalf("first event %v says %d missed", ev.Kind, ev.Missed)
	}
	if err := n2.SetTags(map[string]string{"zone": "b"}); err != nil {
		t.Fatal(err)
	}
	// Then n3's join and death and n2's update, each either received or
	// counted as missed, at least one missed (n3's death may come in late,
	// after the first event was read).
	got, missed := 0, 0
	for {
		var ev node.MemberEvent
		select {
		case ev = <-ch:
		case <-time.After(20 * time.Second):
			t.Fatalf("no update of n2 after %d events", got)
		}
		got, missed = got+1, missed+ev.Missed
		if ev.Kind == node.MemberUpdate && ev.Member.Name == "n2" {
			break
		}
	}
	if missed == 0 || got+missed < 3 {
		t.Fatalf("after the first event: %d received, %d counted missed; want n3's join, n3's death and n2's update accounted for, some missed", got, missed)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, what, cond)
}

// TestMemberTagsChecked: tags that do not fit in memberlist's metadata are
// refused by Validate and by SetTags, with mesh.ErrMetaTooLarge.
func TestMemberTagsChecked(t *testing.T) {
	big := map[string]string{"blob": strings.Repeat("x", 500)}
	cfg := testConfig(t, "n1", t.TempDir())
	cfg.Tags = big
	if err := cfg.Validate(); !errors.Is(err, node.ErrBadConfig) || !errors.Is(err, mesh.ErrMetaTooLarge) {
		t.Fatalf("Validate with %d bytes of tags: %v", len(big["blob"]), err)
	}
	cfg.Tags = map[string]string{"zone": "a"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate with small tags: %v", err)
	}
	n := startNode(t, "n1", t.TempDir())
	if err := n.SetTags(big); !errors.Is(err, mesh.ErrMetaTooLarge) {
		t.Fatalf("SetTags too large: %v", err)
	}
	if err := n.SetTags(map[string]string{"zone": "b"}); err != nil {
		t.Fatal(err)
	}
	if got := n.Tags()["zone"]; got != "b" {
		t.Fatalf("Tags()[zone] = %q", got)
	}
}

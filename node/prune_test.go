package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/node"
)

// A fleet with churn: 1,000 distinct peers get state here (a message to
// each), then leave. Once their grace period is over and nothing is
// queued for them, every per-peer entry is dropped; the one peer that
// still has a message queued keeps its state.
func TestDepartedPeersArePruned(t *testing.T) {
	n := startNodeWith(t, "n1", t.TempDir(), func(*node.Config) {})
	const peers = 1000
	var to []node.Address
	for i := range peers {
		to = append(to, node.Addr("x", fmt.Sprintf("gone%04d", i)))
	}
	to = append(to, node.Addr("x", "queued"))
	if res, err := n.Dispatch(context.Background(), to, wrapperspb.String("m")); err != nil || res.Accepted != len(to) {
		t.Fatalf("Dispatch: %+v, %v", res, err)
	}
	testutil.WaitFor(t, 30*time.Second, "a limiter per peer", func() bool {
		l, _, _, _, _ := n.PeerState()
		return l >= len(to)
	})
	for i := range peers {
		name := fmt.Sprintf("gone%04d", i)
		if _, err := n.Outbox().DropQueue(name, "test"); err != nil {
			t.Fatal(err)
		}
		n.MemberEvent(mesh.Event{Kind: mesh.EventDead, Member: mesh.Member{Name: name}})
	}
	n.MemberEvent(mesh.Event{Kind: mesh.EventLeft, Member: mesh.Member{Name: "queued"}})
	// Within the grace period nothing goes.
	n.PruneDeparted(time.Now())
	if l, _, _, _, d := n.PeerState(); l < len(to) || d != len(to) {
		t.Fatalf("pruned within the grace period: %d limiters, %d departed", l, d)
	}
	later := time.Now().Add(node.DefaultConfig("x").DepartedPeerGrace + time.Second)
	testutil.WaitFor(t, 30*time.Second, "the departed peers pruned", func() bool {
		n.PruneDeparted(later)
		l, _, _, _, d := n.PeerState()
		return l == 1 && d == 1
	})
	limiters, tp, charges, warned, departed := n.PeerState()
	if limiters != 1 || tp != 0 || charges != 0 || warned > 1 || departed != 1 {
		t.Fatalf("after the prune: %d limiters, %d transport peers, %d budgets, %d warnings, %d departed; want the queued peer's only",
			limiters, tp, charges, warned, departed)
	}
	if _, ok := n.Outbox().Stats().LimitByPeer["queued"]; !ok {
		t.Fatal("the peer with a message queued lost its limiter")
	}
	// A peer back before its prune is no longer departed.
	n.MemberEvent(mesh.Event{Kind: mesh.EventAlive, Member: mesh.Member{Name: "queued"}})
	if _, _, _, _, d := n.PeerState(); d != 0 {
		t.Fatalf("%d departed after the peer came back", d)
	}
}

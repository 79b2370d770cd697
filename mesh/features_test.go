package mesh

import (
	"io"
	"slices"
	"testing"

	"github.com/hashicorp/memberlist"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// Features come from gossip metadata; only reachable members that
// advertise a feature are offered, and a change of features is an update.
func TestFeaturesFromMeta(t *testing.T) {
	m := newBare(t, io.Discard)
	d := &delegate{m: m}
	join := func(name string, features ...string) *memberlist.Node {
		n := &memberlist.Node{Name: name, Addr: []byte{127, 0, 0, 1}, Port: 7946,
			Meta: metaBytes(t, &pb.NodeMeta{Cluster: "a", BootId: "b-" + name, ProtocolVersions: []uint32{2}, Features: features})}
		d.NotifyJoin(n)
		return n
	}
	join("b", "forward")
	join("c", "forward", "other")
	join("d")
	e := join("e", "forward")
	d.NotifyLeave(e)
	if got := m.AliveWithFeature("forward", "c"); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("AliveWithFeature = %v, want [b] (c excepted, d without, e gone)", got)
	}
	if !m.HasFeature("c", "other") || m.HasFeature("d", "forward") || m.HasFeature("nobody", "forward") {
		t.Fatal("HasFeature disagrees with the metadata")
	}
	if mem, _ := m.Member("c"); !slices.Equal(mem.Features, []string{"forward", "other"}) {
		t.Fatalf("Member.Features = %v", mem.Features)
	}
	prev := m.view["d"]
	cur := prev
	cur.Features = []string{"forward"}
	if ev, ok := diff(prev, true, cur); !ok || ev != EventUpdate {
		t.Fatalf("a features change: %v %v, want an update", ev, ok)
	}
}

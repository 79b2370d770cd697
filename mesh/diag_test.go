package mesh_test

import "testing"

func dumpNodes(t testing.TB, nodes []*testNode) {
	for _, n := range nodes {
		s := ""
		for _, m := range n.Members() {
			s += m.Name + ":" + m.State.String() + " "
		}
		t.Logf("%s alive=%d %s", n.LocalName(), n.NumAlive(), s)
	}
}

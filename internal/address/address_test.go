package address

import "testing"

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		in, actor, node string
		ok              bool
	}{
		{"a@n1", "a", "n1", true},
		{"@n1", "", "n1", true},
		{"a@", "a", "", true},
		{"a", "a", "", false},
		{"a@b@c", "a@b", "c", true},
		{"y>z@r", "y>z", "r", true},
	} {
		actor, node, ok := Split(tc.in)
		if actor != tc.actor || node != tc.node || ok != tc.ok {
			t.Errorf("Split(%q) = %q, %q, %v; want %q, %q, %v", tc.in, actor, node, ok, tc.actor, tc.node, tc.ok)
		}
		if Node(tc.in) != tc.node {
			t.Errorf("Node(%q) = %q", tc.in, Node(tc.in))
		}
	}
}

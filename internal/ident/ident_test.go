package ident

import "testing"

func TestNewBootIDIsRandomHex(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := NewBootID()
		if len(id) != 16 {
			t.Fatalf("boot id %q: want 16 hex digits", id)
		}
		for _, r := range id {
			if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
				t.Fatalf("boot id %q is not lower-case hex", id)
			}
		}
		if seen[id] {
			t.Fatalf("boot id %q repeated within 100", id)
		}
		seen[id] = true
	}
}

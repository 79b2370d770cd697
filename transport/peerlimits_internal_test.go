package transport

import "testing"

// The limits a connection holds its writes to come from the peer's Hello
// where it announced them, and from this node's config where it did not.
func TestPeerLimitsFromHello(t *testing.T) {
	for _, tt := range []struct {
		name                 string
		ownFrame, ownRead    int
		annFrame             uint32
		annRead              uint64
		wantFrame, wantSlots int
	}{
		{"nothing announced: ours", 4 << 20, 8 << 20, 0, 0, 4 << 20, 2},
		{"the peer's smaller frames and budget", 4 << 20, 8 << 20, 1 << 20, 1 << 20, 1 << 20, 1},
		{"the peer's larger budget, our frames", 4 << 20, 8 << 20, 16 << 20, 64 << 20, 4 << 20, 16},
		{"a budget smaller than a frame: one slot", 4 << 20, 8 << 20, 0, 1 << 10, 4 << 20, 1},
		{"a tiny frame limit is raised to the smallest a config may set", 4 << 20, 8 << 20, 1, 0, minFrameSize, maxLanes + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			frame := frameLimit(tt.ownFrame, tt.annFrame)
			if frame != tt.wantFrame {
				t.Fatalf("frame limit %d, want %d", frame, tt.wantFrame)
			}
			if got := largeSlots(tt.ownRead, tt.annRead, frame); got != tt.wantSlots {
				t.Fatalf("large-frame slots %d, want %d", got, tt.wantSlots)
			}
		})
	}
}

// cutUTF8 cuts at a rune boundary, so a cut receipt text stays valid.
func TestCutUTF8(t *testing.T) {
	for _, tt := range []struct {
		s    string
		n    int
		want string
	}{
		{"héllo", 2, "h"}, // "é" is 2 bytes: not split
		{"héllo", 3, "hé"},
		{"abc", 10, "abc"},
		{"abc", -5, ""},
	} {
		if got := cutUTF8(tt.s, tt.n); got != tt.want {
			t.Errorf("cutUTF8(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

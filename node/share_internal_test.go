package node

import "testing"

// The contenders of a window count in it and in the next one, then no
// more; a window long past (or one whose low 16 bits wrapped to another's)
// starts again from nothing; the count saturates instead of wrapping.
func TestContendersCountForTwoWindows(t *testing.T) {
	var c contenders
	if n := c.count(7); n != 0 {
		t.Fatalf("nothing added: count %d", n)
	}
	c.add(7)
	c.add(7)
	c.add(7)
	for w, want := range map[uint32]int{7: 3, 8: 3, 9: 0, 6 + 1<<16: 0} {
		if n := c.count(w); n != want {
			t.Errorf("three in window 7: count(%d) = %d, want %d", w, n, want)
		}
	}
	c.add(8) // a new window: 7's three are its previous
	if n := c.count(8); n != 3 {
		t.Errorf("three in 7, one in 8: count(8) = %d, want 3 (the larger)", n)
	}
	c.add(9) // 7 is two windows back: forgotten
	if n := c.count(9); n != 1 {
		t.Errorf("one in 8, one in 9: count(9) = %d, want 1", n)
	}
	c.add(20) // long after: nothing carried over
	if n := c.count(21); n != 1 {
		t.Errorf("one in 20: count(21) = %d, want 1", n)
	}
	for range 300 {
		c.add(30)
	}
	if n := c.count(30); n != 255 {
		t.Errorf("300 in window 30: count %d, want 255 (saturated)", n)
	}
}

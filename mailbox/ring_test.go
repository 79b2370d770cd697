package mailbox

import (
	"testing"

	"pgregory.net/rapid"
)

// TestRingMatchesModel checks the ring buffer (push, pop, grow, wrap,
// DropOldest eviction) against a plain slice.
func TestRingMatchesModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		capacity := rapid.IntRange(1, 40).Draw(rt, "capacity")
		m := &Mailbox[int]{capacity: capacity}
		var model []int
		next := 0
		ops := rapid.SliceOfN(rapid.IntRange(0, 2), 1, 200).Draw(rt, "ops")
		for _, op := range ops {
			switch {
			case op == 0 && m.n > 0: // pop
				got := m.popLocked()
				if got != model[0] {
					rt.Fatalf("pop %d, want %d", got, model[0])
				}
				model = model[1:]
			case m.n < capacity: // push
				m.pushLocked(next, 0)
				model = append(model, next)
				next++
			default: // full: DropOldest
				old := m.popLocked()
				if old != model[0] {
					rt.Fatalf("evicted %d, want %d", old, model[0])
				}
				m.pushLocked(next, 0)
				model = append(model[1:], next)
				next++
			}
			if m.n != len(model) || len(m.buf) > capacity {
				rt.Fatalf("n=%d len(buf)=%d, model %d, capacity %d", m.n, len(m.buf), len(model), capacity)
			}
		}
		for len(model) > 0 {
			if got := m.popLocked(); got != model[0] {
				rt.Fatalf("final pop %d, want %d", got, model[0])
			}
			model = model[1:]
		}
	})
}

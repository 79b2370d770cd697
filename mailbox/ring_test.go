package mailbox

import (
	"testing"

	"pgregory.net/rapid"
)

// TestRingMatchesModel checks the ring buffer (push, pop, grow, wrap,
// DropOldest eviction) and its count of low items and their bytes against
// a plain slice.
func TestRingMatchesModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		capacity := rapid.IntRange(1, 40).Draw(rt, "capacity")
		size := func(i int) int64 { return int64(i%7 + 1) }
		m := &Mailbox[int]{capacity: capacity, maxBytes: 1 << 40, size: size}
		type item struct {
			v   int
			low bool
		}
		var model []item
		next := 0
		push := func(rt *rapid.T) item {
			it := item{next, rapid.Bool().Draw(rt, "low")}
			m.pushLocked(it.v, size(it.v), it.low)
			next++
			return it
		}
		ops := rapid.SliceOfN(rapid.IntRange(0, 2), 1, 200).Draw(rt, "ops")
		for _, op := range ops {
			switch {
			case op == 0 && m.n > 0: // pop
				got := m.popLocked()
				if got != model[0].v {
					rt.Fatalf("pop %d, want %d", got, model[0].v)
				}
				model = model[1:]
			case m.n < capacity: // push
				model = append(model, push(rt))
			default: // full: DropOldest
				old := m.popLocked()
				if old != model[0].v {
					rt.Fatalf("evicted %d, want %d", old, model[0].v)
				}
				model = append(model[1:], push(rt))
			}
			lowN, lowBytes, bytes := 0, int64(0), int64(0)
			for _, it := range model {
				bytes += size(it.v)
				if it.low {
					lowN++
					lowBytes += size(it.v)
				}
			}
			if m.n != len(model) || len(m.buf) > capacity {
				rt.Fatalf("n=%d len(buf)=%d, model %d, capacity %d", m.n, len(m.buf), len(model), capacity)
			}
			if n, b := m.lowCounts(); n != lowN || b != lowBytes || m.bytes != bytes {
				rt.Fatalf("low %d (%d B), bytes %d; model low %d (%d B), bytes %d", n, b, m.bytes, lowN, lowBytes, bytes)
			}
		}
		for len(model) > 0 {
			if got := m.popLocked(); got != model[0].v {
				rt.Fatalf("final pop %d, want %d", got, model[0].v)
			}
			model = model[1:]
		}
		if n, b := m.lowCounts(); n != 0 || b != 0 || m.bytes != 0 {
			rt.Fatalf("empty ring counts low %d (%d B), bytes %d", n, b, m.bytes)
		}
	})
}

func (m *Mailbox[T]) lowCounts() (int, int64) {
	if m.low == nil {
		return 0, 0
	}
	return m.low.n, m.low.bytes
}

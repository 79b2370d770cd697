package outbox

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestDueIndexModel drives the two-level due index with random inserts,
// removals, deferrals, wake-ups and node exclusions, and checks every
// DueRecipients answer against a plain sort of the queues it should see.
func TestDueIndexModel(t *testing.T) {
	cfg := DefaultConfig(filepath.Join(t.TempDir(), "outbox.db"))
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	rapid.Check(t, func(rt *rapid.T) {
		s.mu.Lock()
		for _, st := range s.queues {
			s.removeQueue(st)
		}
		clear(s.excluded)
		s.depth = 0
		s.mu.Unlock()
		rcpt := rapid.Custom(func(rt *rapid.T) string {
			return fmt.Sprintf("a%d@n%d", rapid.IntRange(0, 5).Draw(rt, "actor"), rapid.IntRange(0, 4).Draw(rt, "node"))
		})
		node := rapid.Custom(func(rt *rapid.T) string { return fmt.Sprintf("n%d", rapid.IntRange(0, 4).Draw(rt, "node")) })
		for range rapid.IntRange(1, 60).Draw(rt, "steps") {
			// Draw before locking: a draw may end the case (rapid panics
			// while it shrinks), which must not leave mu held.
			op, r, n := rapid.IntRange(0, 5).Draw(rt, "op"), rcpt.Draw(rt, "r"), node.Draw(rt, "n")
			at := rapid.Int64Range(0, 20).Draw(rt, "at")
			switch op {
			case 0: // a queue appears (or its send_at moves)
				s.mu.Lock()
				if st := s.queues[r]; st != nil {
					s.setSendAt(st, at)
				} else {
					st := &queue{name: r, node: r[len(r)-2:], sendAt: at}
					st.seqs.add(1)
					s.insertQueue(st)
				}
				s.mu.Unlock()
			case 1: // a queue empties
				s.mu.Lock()
				if st := s.queues[r]; st != nil {
					s.depth -= st.count()
					s.removeQueue(st)
				}
				s.mu.Unlock()
			case 2:
				s.ExcludeNode(n)
			case 3:
				s.IncludeNode(n)
			case 4:
				s.WakeNode(n)
			case 5: // only a query
			}
			now := rapid.Int64Range(0, 20).Draw(rt, "now")
			limit := rapid.IntRange(1, 8).Draw(rt, "limit")
			drop := rapid.SampledFrom([]string{"", "a0", "a1"}).Draw(rt, "drop actor")
			keep := func(r string) bool { return drop == "" || r[:2] != drop }
			wantDue, wantNext := s.naiveDue(now, keep, limit)
			due, next := s.DueRecipients(now, keep, limit)
			if !slices.Equal(due, wantDue) || next != wantNext {
				rt.Fatalf("DueRecipients(%d, drop %q, %d) = %v, %d; want %v, %d", now, drop, limit, due, next, wantDue, wantNext)
			}
		}
	})
}

// naiveDue is what DueRecipients must answer, from a sort of every queue
// of the included nodes.
func (s *Store) naiveDue(nowMs int64, keep func(string) bool, limit int) (due []string, next int64) {
	s.mu.RLock()
	var qs []*queue
	for _, st := range s.queues {
		if _, out := s.excluded[st.node]; !out {
			qs = append(qs, st)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(qs, func(a, b *queue) int {
		if c := cmp.Compare(a.sendAt, b.sendAt); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	for _, st := range qs {
		if !keep(st.name) {
			continue
		}
		if st.sendAt > nowMs {
			return due, st.sendAt
		}
		if len(due) == limit {
			return due, nowMs
		}
		due = append(due, st.name)
	}
	return due, 0
}

package partition

import (
	"slices"
	"testing"
)

// TestDoneStoringRunTakesExactlyItsSequences: the committer hands the
// relay a run of one stream's commits at once. Whatever their order
// against the stream's storing list (a producer's commits come from the
// list's front; two producers' may interleave), exactly the run's
// sequences leave the list, and the rest keep their order: a sequence left
// behind would hold the stream forever, one taken early would let the
// relay send above a message still committing.
func TestDoneStoringRunTakesExactlyItsSequences(t *testing.T) {
	r := newTestRelay(t, nopDeliverer{})
	for _, tc := range []struct {
		name      string
		list, run []uint64
		want      []uint64
	}{
		{"the list's front, in order", []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3}, []uint64{4, 5}},
		{"the whole list", []uint64{1, 2, 3}, []uint64{1, 2, 3}, []uint64{}},
		{"out of order", []uint64{1, 2, 3, 4, 5}, []uint64{2, 1, 5}, []uint64{3, 4}},
		{"the front, then further in", []uint64{1, 2, 3, 4, 5, 6}, []uint64{1, 2, 5}, []uint64{3, 4, 6}},
		{"not from the front", []uint64{1, 2, 3, 4}, []uint64{3, 4}, []uint64{1, 2}},
		{"a sequence not in the list", []uint64{1, 2, 3}, []uint64{1, 9, 3}, []uint64{2}},
		{"one", []uint64{7}, []uint64{7}, []uint64{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := r.lockStream("a@n1")
			if err != nil {
				t.Fatal(err)
			}
			st.storing = slices.Clone(tc.list)
			st.mu.Unlock()
			run := make([]storedSeq, len(tc.run))
			for i, q := range tc.run {
				run[i] = storedSeq{st, q}
			}
			r.doneStoringRun(st, run)
			st.mu.Lock()
			got := slices.Clone(st.storing)
			st.storing = nil
			st.mu.Unlock()
			if !slices.Equal(got, tc.want) {
				t.Fatalf("storing %v, run %v: left %v, want %v", tc.list, tc.run, got, tc.want)
			}
		})
	}
}

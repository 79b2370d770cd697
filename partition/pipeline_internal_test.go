package partition

import (
	"slices"
	"testing"
)

func TestSortedHelpers(t *testing.T) {
	tests := []struct {
		name        string
		a, b        []uint64
		merged, rem []uint64
	}{
		{"empty", nil, nil, []uint64{}, nil},
		{"append", []uint64{1, 2}, []uint64{3, 4}, []uint64{1, 2, 3, 4}, []uint64{1, 2}},
		{"interleave", []uint64{1, 3, 5}, []uint64{2, 3, 6}, []uint64{1, 2, 3, 3, 5, 6}, []uint64{1, 5}},
		{"all", []uint64{7, 8}, []uint64{7, 8}, []uint64{7, 7, 8, 8}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mergeSorted(tt.a, tt.b); !slices.Equal(got, tt.merged) {
				t.Fatalf("mergeSorted = %v, want %v", got, tt.merged)
			}
			if got := removeSorted(slices.Clone(tt.a), tt.b); !slices.Equal(got, tt.rem) {
				t.Fatalf("removeSorted = %v, want %v", got, tt.rem)
			}
		})
	}
}

func TestBusyRespectsAckPipeline(t *testing.T) {
	p := &part{rcpts: map[string]*rstate{}}
	tests := []struct {
		name string
		st   *rstate
		max  int
		want bool
	}{
		{"unknown", nil, 2, false},
		{"sending", &rstate{sending: true}, 2, true},
		{"acks below bound", &rstate{ackBatches: 1}, 2, false},
		{"acks at bound", &rstate{ackBatches: 2}, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clear(p.rcpts)
			if tt.st != nil {
				p.rcpts["a@n1"] = tt.st
			}
			if got := p.busy("a@n1", tt.max); got != tt.want {
				t.Fatalf("busy = %v, want %v", got, tt.want)
			}
		})
	}
}

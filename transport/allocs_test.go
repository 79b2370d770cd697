//go:build !race

// The race detector drops sync.Pool puts at random, so allocation counts
// are only meaningful without it.

package transport_test

import "testing"

// maxAllocsPerReceipt bounds the allocations of both transports per
// message of a relay emission (envelope out, receipt back), measured with
// `go test -run '^$' -bench BenchmarkRequestBatch -benchmem ./transport`
// (allocs/op over 1,024): 7.8, with headroom for the connections'
// background work. It was 10.8 with a generic receipt codec and a channel
// per waiting receipt. Lower it with a gain; raise it only with a reason.
const maxAllocsPerReceipt = 9

func TestAllocsPerReceipt(t *testing.T) {
	const size = 1024
	a, envs := emissionPair(t, size)
	per := testing.AllocsPerRun(5, func() { emission(t, a, envs) }) / size
	t.Logf("%.1f allocs per message of an emission (limit %d)", per, maxAllocsPerReceipt)
	if per > maxAllocsPerReceipt {
		t.Errorf("an emission allocates %.1f per message, more than %d", per, maxAllocsPerReceipt)
	}
}

package node

import (
	"testing"
	"unsafe"
)

// Every cached stream is one inStream: at 64 bytes it is allocated from
// the 64-byte size class; one more field moves it to 80 (16 bytes more for
// each of a receiver's streams; BenchmarkReceiverStreamState measures the
// total).
func TestInStreamFitsSixtyFourBytes(t *testing.T) {
	if got := unsafe.Sizeof(inStream{}); got > 64 {
		t.Fatalf("inStream is %d bytes, want at most 64", got)
	}
}

func TestElapsedSeconds(t *testing.T) {
	for _, tc := range []struct {
		ms   int64
		want int32
	}{{-5, 0}, {0, 0}, {999, 0}, {1000, 1}, {1 << 62, 1<<31 - 1}} {
		if got := elapsedSeconds(tc.ms); got != tc.want {
			t.Errorf("elapsedSeconds(%d) = %d, want %d", tc.ms, got, tc.want)
		}
	}
}

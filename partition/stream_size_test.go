package partition

import (
	"testing"
	"unsafe"
)

// A relay keeps a stream per recipient it has sent to: at 128 bytes it is
// allocated from the 128-byte size class; one more field, or fields out of
// order, moves it to 144 or 160.
func TestStreamFits128Bytes(t *testing.T) {
	if got := unsafe.Sizeof(stream{}); got > 128 {
		t.Fatalf("stream is %d bytes, want at most 128", got)
	}
}

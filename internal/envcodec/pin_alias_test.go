package envcodec_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Keeping only the 1-byte body of each decoded envelope (non-owned path,
// the one every peeked frame and outbox record takes) must not keep its
// whole decoder copy alive (here 32 KiB of headers per kept byte): a
// small body with much more of its frame around it gets a copy of its own.
func TestSmallBodyDoesNotPinItsHeaders(t *testing.T) {
	in := &pb.Envelope{MsgId: "id", Headers: map[string]string{"k": strings.Repeat("h", 32<<10)},
		Body: &anypb.Any{TypeUrl: "u", Value: []byte{1}}}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	kept := make([][]byte, n)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for i := range kept {
		env, ok := envcodec.Decode(b, false)
		if !ok {
			t.Fatal("fast path refused")
		}
		kept[i] = env.Body.Value
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	grew := int64(m1.HeapAlloc) - int64(m0.HeapAlloc)
	runtime.KeepAlive(kept)
	if grew > 4<<20 {
		t.Fatalf("keeping %d one-byte bodies holds %d KiB of heap (%d B per body)", n, grew>>10, grew/n)
	}
}

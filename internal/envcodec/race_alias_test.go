package envcodec_test

import (
	"bytes"
	"sync"
	"testing"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// One goroutine writes every body byte while another reads every string of
// the same decoded envelope (strings laid out right before and after the
// body in the same allocation, sub-word sizes): -race must stay quiet.
func TestBodyWritesDoNotRaceStringReads(t *testing.T) {
	for _, owned := range []bool{false, true} {
		for bl := 1; bl <= 17; bl++ {
			in := &pb.Envelope{MsgId: "i", Type: "t", Body: &anypb.Any{TypeUrl: "u", Value: bytes.Repeat([]byte{7}, bl)},
				Rpc: &pb.RpcMeta{Method: "m"}, CoalesceKey: "c", Headers: map[string]string{"k": "v"}}
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			env, ok := envcodec.Decode(b, owned)
			if !ok {
				t.Fatal("fast path refused")
			}
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				v := env.Body.Value
				for r := 0; r < 200; r++ {
					for i := range v {
						v[i] = byte(r)
					}
				}
			}()
			bad := false
			go func() {
				defer wg.Done()
				for r := 0; r < 200; r++ {
					s := env.MsgId + env.Type + env.Body.TypeUrl + env.Rpc.Method + env.CoalesceKey + env.Headers["k"]
					if s != "itumcv" {
						bad = true
					}
				}
			}()
			wg.Wait()
			if bad {
				t.Fatalf("owned=%v len=%d: a string changed", owned, bl)
			}
		}
	}
}

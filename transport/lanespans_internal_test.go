package transport

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// queuedFrames splits a lane's queue into its frames: where each lies.
func queuedFrames(t *testing.T, l *lane) (all []span, large []span, size int64) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var q []byte
	for _, ch := range l.chunks {
		q = append(q, *ch...)
	}
	if int64(len(q)) != l.size {
		t.Fatalf("lane size %d, its chunks hold %d bytes", l.size, len(q))
	}
	for at := 0; at < len(q); {
		v, n := protowire.ConsumeVarint(q[at:])
		if n < 0 || at+n+int(v) > len(q) {
			t.Fatalf("bad frame at %d of %d", at, len(q))
		}
		all = append(all, span{int64(at), int64(at + n + int(v))})
		at += n + int(v)
	}
	return all, append([]span(nil), l.large...), l.size
}

func spanEnvelope(rng *rand.Rand, i int) *pb.Envelope {
	env := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("m%d", i), Sender: fmt.Sprintf("s%d@a", rng.Intn(3)), Recipient: fmt.Sprintf("r%d@b", rng.Intn(3))}
	n := 16<<10 - 120 + rng.Intn(200)
	switch rng.Intn(5) {
	case 0:
		n = rng.Intn(300)
	case 1:
		n = 64<<10 - 200 + rng.Intn(400)
	}
	switch rng.Intn(3) {
	case 0:
		b, _ := anypb.New(wrapperspb.Bytes(make([]byte, n)))
		b.TypeUrl += strings.Repeat("t", rng.Intn(3)*50)
		env.Body = b
	case 1:
		env.Body = &anypb.Any{Value: make([]byte, n)} // no type
	default:
		env.Body = &anypb.Any{TypeUrl: "x/y", Value: make([]byte, n)}
		env.Origin = &pb.Origin{Node: "o", OutboxId: []byte("0123456789abcdef"), Certificate: make([]byte, 500+rng.Intn(3)*10), Signature: []byte("sig")}
	}
	return env
}

// Whatever a lane queues (named types, routes, origins, plain frames,
// batches and single encoded envelopes), its large spans are exactly its
// queue's frames too large for the peer's stream buffer.
func TestLaneLargeSpansAreItsLargeFrames(t *testing.T) {
	for _, feat := range []struct{ names, routes, origins bool }{{false, false, false}, {true, false, false}, {true, true, false}, {true, true, true}, {false, true, true}} {
		t.Run(fmt.Sprintf("%v", feat), func(t *testing.T) {
			cfg := DefaultConfig("x")
			cfg.SendQueueBytes = 1 << 30
			cfg.SendQueueSize = 1 << 20
			c := &conn{t: &Transport{cfg: cfg}, done: make(chan struct{}), maxFrame: cfg.MaxFrameSize, names: feat.names, routes: feat.routes, origins: feat.origins}
			l := &lane{c: c, wake: make(chan struct{}, 1)}
			rng := rand.New(rand.NewSource(1))
			for i := 0; i < 300; i++ {
				var err error
				switch rng.Intn(3) {
				case 0:
					err = l.enqueueEnvelopes([]*pb.Envelope{spanEnvelope(rng, i)})
				case 1:
					var batch []*pb.Envelope
					for j := rng.Intn(6); j >= 0; j-- {
						batch = append(batch, spanEnvelope(rng, i*10+j))
					}
					err = l.enqueueEnvelopes(batch)
				default:
					env := spanEnvelope(rng, i)
					if env.Origin != nil {
						env.Origin = nil
					}
					b, _ := proto.Marshal(env)
					err = l.enqueueEncoded(b, Body{})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("named frames %d, frames %d", l.named, l.n)
			all, large, _ := queuedFrames(t, l)
			var want []span
			for _, f := range all {
				if isLarge(int(f.to - f.from)) {
					want = append(want, f)
				}
			}
			if len(want) == 0 {
				t.Fatal("no large frames queued")
			}
			if fmt.Sprint(large) != fmt.Sprint(want) {
				t.Fatalf("lane notes large spans\n%v\nits large frames are\n%v", large, want)
			}
		})
	}
}

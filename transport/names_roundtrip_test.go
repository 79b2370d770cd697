package transport

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// laneBytes is what l's chunks hold.
func laneBytes(l *lane) []byte {
	var b []byte
	for _, ch := range l.chunks {
		b = append(b, *ch...)
	}
	return b
}

// Envelopes of every shape a lane encodes, named in runs of which some
// are refused (unname), read back by a receiver: each arrives as sent,
// in order, none of a refused run, and each envelope's size is the bytes
// its frames took.
func FuzzLaneNamesRoundTrip(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, true, true, true)
	f.Add([]byte{255, 17, 33, 200, 1, 1, 1, 9, 80, 81, 82, 83}, true, false, false)
	f.Add([]byte{3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3}, false, true, true)
	f.Add([]byte{15, 1, 15, 2, 33, 3, 51, 1, 15, 3, 87, 2, 15, 1}, false, false, true)
	f.Fuzz(func(t *testing.T, ops []byte, typed, routed, origined bool) {
		c := &conn{names: typed, routes: routed, origins: origined, maxFrame: 1 << 20}
		l := &lane{c: c}
		var want []*pb.Envelope
		written := 0
		for len(ops) >= 2 {
			op, arg := ops[0], ops[1]
			ops = ops[2:]
			n := 1 + int(arg%4)
			var enc []byte
			var run []encodedEnv
			var envs []*pb.Envelope
			for j := range n {
				k := int(op)*7 + j*int(arg)
				env := &pb.Envelope{MsgId: fmt.Sprint("m", k)}
				if k%5 != 0 {
					env.ProtocolVersion = pb.ProtocolVersion
				}
				switch (k / 3) % 6 {
				case 0:
					env.Sender = fmt.Sprintf("s%d@a", k%70)
					env.Recipient = fmt.Sprintf("r%d@b", k%3)
				case 1:
					env.Sender = ""
					env.Recipient = "r@b"
				case 2:
					env.Sender = "only@a"
				case 3:
					env.Sender = strings.Repeat("S", 100+k%900) + "@a"
					env.Recipient = "r@b"
				case 4:
					env.Sender, env.Recipient = "s\xffbad", "r@b" // invalid UTF-8: proto path
				case 5:
					env.Sender, env.Recipient = "x@a", "y@b"
					switch k % 4 {
					case 0: // no certificate: nothing to name
						env.Origin = &pb.Origin{Node: "o", OutboxId: []byte{byte(k)}}
					case 1: // forwarded: one of many origins, some certificates large
						env.Origin = &pb.Origin{Node: fmt.Sprint("o", k%20), OutboxId: []byte{byte(k), 1, 2},
							Certificate: bytes.Repeat([]byte{byte(k)}, 100+k%1500), Signature: []byte{9, byte(k)}}
					case 2: // a certificate alone
						env.Origin = &pb.Origin{Certificate: []byte{byte(k % 3)}}
					case 3: // a signature alone: nothing to name
						env.Origin = &pb.Origin{Signature: []byte{1}}
					}
				}
				if k%4 != 0 {
					env.Body = &anypb.Any{TypeUrl: fmt.Sprintf("t/%d", k%80) + strings.Repeat("u", (k%3)*300), Value: []byte{byte(k)}}
				} else if k%8 == 0 {
					env.Body = &anypb.Any{Value: []byte("noType")}
				}
				if k%7 == 0 {
					env.Headers = map[string]string{"h": fmt.Sprint(k)}
				}
				if k%9 == 0 {
					env.Type = "ty"
				}
				at := len(enc)
				var body Body
				var err error
				if enc, body, err = appendEnvelope(enc, env, 1<<20); err != nil {
					continue
				}
				run = append(run, encodedEnv{from: at, to: len(enc), body: body})
				envs = append(envs, env)
			}
			size := 0
			for i := range run {
				l.name(&run[i], enc[run[i].from:run[i].to])
				size += int(run[i].size)
			}
			if op%5 == 4 { // refused
				for i := range run {
					l.unname(&run[i], enc[run[i].from:run[i].to])
				}
				continue
			}
			before := len(laneBytes(l))
			for i := range run {
				l.appendFrameLocked(&run[i], enc[run[i].from:run[i].to])
			}
			if got := len(laneBytes(l)) - before; got != size {
				t.Fatalf("a run sized %d bytes wrote %d", size, got)
			}
			written += size
			want = append(want, envs...)
		}
		stream := laneBytes(l)
		if len(stream) != written {
			t.Fatalf("%d bytes on the stream, %d sized", len(stream), written)
		}
		sr := &streamReader{br: bufio.NewReaderSize(bytes.NewReader(stream), readBufSize), max: 1 << 20}
		var ns names
		i := 0
		for {
			env, refs, other, _, err := sr.readEnvelopeFrame(64, 16<<10)
			if err != nil {
				break
			}
			got, err := ns.take(env, refs, other)
			if err != nil {
				t.Fatalf("frame after %d envelopes: %v", i, err)
			}
			if got == nil {
				continue
			}
			if i >= len(want) {
				t.Fatalf("more envelopes than sent")
			}
			if !proto.Equal(got, want[i]) {
				t.Fatalf("envelope %d arrived as %v, sent %v", i, got, want[i])
			}
			i++
		}
		if i != len(want) {
			t.Fatalf("%d envelopes read, %d sent", i, len(want))
		}
		if len(ns.routes) > maxRoutes || ns.rbytes > maxRouteBytes || len(ns.urls) > maxNames || ns.bytes > maxNameBytes ||
			len(ns.origins) > maxOrigins || ns.obytes > maxOriginBytes {
			t.Fatalf("receiver holds %d routes of %d bytes, %d names of %d, %d origins of %d",
				len(ns.routes), ns.rbytes, len(ns.urls), ns.bytes, len(ns.origins), ns.obytes)
		}
		if !typed && len(ns.urls) > 0 || !routed && len(ns.routes) > 0 || !origined && len(ns.origins) > 0 {
			t.Fatal("a name sent to a peer that does not take it")
		}
	})
}

var _ = envcodec.Body{}

package transport

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
)

// Receipts read one after another from one control stream, some in the
// bufio buffer (peeked), some larger than it, some signed (the generic
// path), with GoAway between: every receipt keeps its own bytes after the
// next frames are read (nothing aliases the reused buffer), equal to what
// was sent, and the stream ends with io.EOF.
func TestReadControlFrameStreamNoAliasing(t *testing.T) {
	var sent []*pb.Receipt
	var stream []byte
	var err error
	for i := range 300 {
		rc := &pb.Receipt{
			MsgId:     strings.Repeat(string(rune('a'+i%26)), 1+i%40),
			Code:      pb.Receipt_Code(i%12 - 1),
			Message:   strings.Repeat("é", (i*97)%(3*readBufSize/2)),
			Watermark: uint64(i) << (i % 60),
		}
		if i%5 == 0 {
			rc.Signature = &pb.ReceiptSignature{Node: "n", Certificate: bytes.Repeat([]byte{byte(i)}, i), Signature: []byte{byte(i)}}
		}
		if stream, err = appendReceiptFrame(stream, rc, 1<<20); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, rc)
		if i%50 == 49 {
			if stream, err = AppendFrame(stream, &pb.Frame{Kind: &pb.Frame_Goaway{Goaway: &pb.GoAway{Code: 1, Reason: "x"}}}); err != nil {
				t.Fatal(err)
			}
			sent = append(sent, nil)
		}
	}
	// A reader that hands out a few bytes at a time: frames straddle reads.
	br := bufio.NewReaderSize(iotestHalf{bytes.NewReader(stream)}, readBufSize)
	sr := &streamReader{br: br, budget: newReadBudget(4 << 20), done: make(chan struct{}), max: 1 << 20}
	var got []*pb.Receipt
	for {
		rc, _, other, _, err := sr.readControlFrame()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("frame %d: %v", len(got), err)
		}
		if rc == nil {
			if _, ok := other.(*pb.Frame_Goaway); !ok {
				t.Fatalf("frame %d: other %T", len(got), other)
			}
		}
		got = append(got, rc)
	}
	if len(got) != len(sent) {
		t.Fatalf("read %d frames, sent %d", len(got), len(sent))
	}
	for i := range sent {
		if !proto.Equal(got[i], sent[i]) {
			t.Fatalf("frame %d: read %v, sent %v", i, got[i], sent[i])
		}
	}
	if sr.budget.inUse() != 0 {
		t.Fatalf("%d bytes of read budget still held", sr.budget.inUse())
	}
}

// iotestHalf returns at most 1000 bytes per Read.
type iotestHalf struct{ r io.Reader }

func (h iotestHalf) Read(p []byte) (int, error) {
	if len(p) > 1000 {
		p = p[:1000]
	}
	return h.r.Read(p)
}

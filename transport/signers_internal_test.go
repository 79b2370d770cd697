package transport

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// controlLane is a connection's control lane whose peer reads signer
// names when signers is set, with the frame limit maxFrame, and no writer:
// what it queues stays in its chunks.
func controlLane(signers bool, maxFrame int) *lane {
	c := &conn{t: &Transport{cfg: Config{SendQueueSize: 1 << 10, SendQueueBytes: 64 << 20}}, signers: signers,
		maxFrame: maxFrame, done: make(chan struct{})}
	return &lane{c: c, control: true, wake: make(chan struct{}, 1)}
}

// readReceipts reads b as a control stream does, putting named signers
// back, and returns its receipts in order.
func readReceipts(t *testing.T, b []byte) []*pb.Receipt {
	t.Helper()
	sr := &streamReader{br: bufio.NewReader(bytes.NewReader(b)), budget: newReadBudget(64 << 20), done: make(chan struct{}), max: 64 << 20}
	var named names
	var got []*pb.Receipt
	for {
		rc, signer, other, _, err := sr.readControlFrame()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatalf("frame after %d receipts: %v", len(got), err)
		}
		if rc == nil {
			sn, ok := other.(*pb.Frame_SignerName)
			if !ok {
				t.Fatalf("frame after %d receipts: %T", len(got), other)
			}
			if err := named.addSigner(sn.SignerName); err != nil {
				t.Fatalf("frame after %d receipts: %v", len(got), err)
			}
			continue
		}
		if signer != 0 {
			if err := named.applySigner(rc, signer); err != nil {
				t.Fatalf("receipt %d: %v", len(got), err)
			}
		}
		got = append(got, rc)
	}
}

// readAsSent checks that what l queued (and counts) reads back as want,
// in order.
func readAsSent(t *testing.T, l *lane, want []*pb.Receipt) {
	t.Helper()
	b := laneBytes(l)
	if got := l.unwritten.Load(); got != int64(len(b)) {
		t.Fatalf("lane counts %d bytes, queued %d", got, len(b))
	}
	got := readReceipts(t, b)
	if len(got) != len(want) {
		t.Fatalf("%d receipts read, %d sent", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("receipt %d: read %v, sent %v", i, got[i], want[i])
		}
	}
}

// signedReceipt is a receipt signed by signer s, its certificate of
// certLen bytes.
func signedReceipt(i, s, certLen int) *pb.Receipt {
	return &pb.Receipt{MsgId: fmt.Sprint("m", i), Code: pb.Receipt_PROCESSED, Watermark: uint64(i + 1), WatermarkDigest: uint64(i) * 7919,
		Signature: &pb.ReceiptSignature{Node: fmt.Sprint("s", s), Certificate: bytes.Repeat([]byte{byte(s)}, certLen), Signature: []byte{9, byte(i)}}}
}

// The frames a control lane writes for signed receipts are those proto
// reads as a SignerName (the very bytes proto writes) and as a receipt
// whose signature has neither node nor certificate, with Frame.signer.
func TestSignerFramesAreProtos(t *testing.T) {
	l := controlLane(true, 1<<20)
	rcs := []*pb.Receipt{signedReceipt(0, 1, 450), signedReceipt(1, 1, 450), signedReceipt(2, 2, 300)}
	for _, rc := range rcs {
		if err := l.enqueueReceipt(rc); err != nil {
			t.Fatal(err)
		}
	}
	name := func(ref uint32, rc *pb.Receipt) *pb.Frame {
		s := rc.GetSignature()
		return &pb.Frame{Kind: &pb.Frame_SignerName{SignerName: &pb.SignerName{Ref: ref, Node: s.GetNode(), Certificate: s.GetCertificate()}}}
	}
	named := func(ref uint32, rc *pb.Receipt) *pb.Frame {
		cut := proto.CloneOf(rc)
		cut.Signature.Node, cut.Signature.Certificate = "", nil
		return &pb.Frame{Kind: &pb.Frame_Receipt{Receipt: cut}, Signer: ref}
	}
	want := []*pb.Frame{name(1, rcs[0]), named(1, rcs[0]), named(1, rcs[1]), name(2, rcs[2]), named(2, rcs[2])}
	b := laneBytes(l)
	if l.n != 3 || l.named != 2 || l.unwritten.Load() != int64(len(b)) {
		t.Fatalf("lane counts %d receipts, %d names, %d bytes; want 3, 2, %d", l.n, l.named, l.unwritten.Load(), len(b))
	}
	for i, w := range want {
		size, n := protowire.ConsumeVarint(b)
		if n < 0 || int(size) > len(b)-n {
			t.Fatalf("frame %d: bad length prefix in %x", i, b)
		}
		frame := b[:n+int(size)]
		b = b[n+int(size):]
		var got pb.Frame
		if err := proto.Unmarshal(frame[n:], &got); err != nil || !proto.Equal(&got, w) {
			t.Fatalf("frame %d reads as %v (%v), want %v", i, &got, err, w)
		}
		if w.GetSignerName() != nil {
			if pw, err := AppendFrame(nil, w); err != nil || !bytes.Equal(frame, pw) {
				t.Fatalf("frame %d: wrote\n%x\nproto writes\n%x (%v)", i, frame, pw, err)
			}
		}
	}
	if len(b) > 0 {
		t.Fatalf("%d bytes after the frames", len(b))
	}
}

// Receipts of every shape a control lane writes, read back by a receiver
// that puts named signers back: each arrives as sent, in order, and the
// lane counts the bytes it queued.
func FuzzSignerNamesRoundTrip(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, true, uint16(0))
	f.Add([]byte{1, 1, 1, 1, 2, 2, 2, 2, 3, 3}, true, uint16(700))
	f.Add([]byte{200, 17, 33, 201, 1, 9, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94}, true, uint16(0))
	f.Add([]byte{5, 6, 7}, false, uint16(0))
	f.Fuzz(func(t *testing.T, ops []byte, signers bool, limit uint16) {
		maxFrame := 1 << 20
		if limit > 0 {
			maxFrame = 600 + int(limit)%4000
		}
		l := controlLane(signers, maxFrame)
		var want []*pb.Receipt
		for i, op := range ops {
			var rc *pb.Receipt
			switch s := int(op) % 24; {
			case s < 20: // one of 20 signers, some certificates large
				rc = signedReceipt(i, s, 100+int(op)*7%1500)
			case s == 20:
				rc = &pb.Receipt{MsgId: fmt.Sprint("m", i), Code: pb.Receipt_CAPACITY, RetryAfterMs: 5, Message: "full"}
			case s == 21: // a node alone: nothing to name
				rc = &pb.Receipt{MsgId: fmt.Sprint("m", i), Signature: &pb.ReceiptSignature{Node: "n", Signature: []byte{1}}}
			case s == 22: // a certificate alone: nothing to name
				rc = &pb.Receipt{MsgId: fmt.Sprint("m", i), Signature: &pb.ReceiptSignature{Certificate: []byte{byte(i)}}}
			default: // unknown fields in the receipt and its signature
				rc = signedReceipt(i, int(op)%3, 200)
				rc.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), uint64(i)))
				rc.Signature.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 15, protowire.BytesType), "x"))
			}
			before := proto.CloneOf(rc)
			if err := l.enqueueReceipt(rc); err != nil {
				if !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("receipt %d: %v", i, err)
				}
				continue
			}
			if !proto.Equal(rc, before) {
				t.Fatalf("receipt %d changed by its send: %v, was %v", i, rc, before)
			}
			want = append(want, before)
		}
		readAsSent(t, l, want)
		if !signers && l.signers != nil {
			t.Fatal("signers named to a peer that does not read them")
		}
	})
}

// A ref past those named is refused by every kind of name, whatever an
// int's size (where it has 32 bits, int(0xFFFFFFFF) is -1 and passed a
// bound check of int(ref) > len, and the index panicked).
func TestLargestRefsAreRefused(t *testing.T) {
	var ns names
	if err := ns.add(&pb.TypeName{Ref: 1, Url: "t/a"}); err != nil {
		t.Fatal(err)
	}
	if err := ns.addRoute(&pb.RouteName{Ref: 1, Sender: "s@a", Recipient: "r@b"}); err != nil {
		t.Fatal(err)
	}
	if err := ns.addOrigin(&pb.OriginName{Ref: 1, Node: "o", Certificate: []byte("c")}); err != nil {
		t.Fatal(err)
	}
	if err := ns.addSigner(&pb.SignerName{Ref: 1, Node: "s", Certificate: []byte("c")}); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []uint32{2, 1 << 31, 0xFFFFFFFE, 0xFFFFFFFF} {
		env := &pb.Envelope{Body: &anypb.Any{Value: []byte("v")}, Origin: &pb.Origin{Signature: []byte("s")}}
		for what, err := range map[string]error{
			"type":   ns.apply(env, ref),
			"route":  ns.applyRoute(env, ref),
			"origin": ns.applyOrigin(env, ref),
			"signer": ns.applySigner(&pb.Receipt{Signature: &pb.ReceiptSignature{Signature: []byte("s")}}, ref),
		} {
			if err == nil {
				t.Errorf("%s ref %d of 1 named: taken", what, ref)
			}
		}
	}
}

// Edge shapes of signed receipts (no signature bytes, nothing but the
// signer, a one-byte certificate, one certificate under two node names,
// an unknown field in the signature) read back as sent through a control
// lane that names signers, at frame limits down to where the naming
// frame no longer fits.
func TestSignerEdgeShapesRoundTrip(t *testing.T) {
	cert := bytes.Repeat([]byte{3}, 450)
	shapes := []*pb.Receipt{
		{MsgId: "a", Signature: &pb.ReceiptSignature{Node: "n", Certificate: cert}},
		{Signature: &pb.ReceiptSignature{Node: "n", Certificate: cert}},
		{MsgId: "c", Code: pb.Receipt_REJECTED, Message: "é", Signature: &pb.ReceiptSignature{Node: "m", Certificate: cert, Signature: []byte{1}}},
		{MsgId: "d", Signature: &pb.ReceiptSignature{Node: "n", Certificate: []byte{0}}},
		{MsgId: "e", Signature: &pb.ReceiptSignature{Node: "n", Certificate: cert}},
	}
	uk := proto.CloneOf(shapes[0])
	uk.MsgId = "f"
	uk.Signature.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7))
	shapes = append(shapes, uk)
	for _, limit := range []int{1 << 20, 1024, 470, 463, 462, 461, 460} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			l := controlLane(true, limit)
			var want []*pb.Receipt
			for i, rc := range shapes {
				before := proto.CloneOf(rc)
				if err := l.enqueueReceipt(rc); err != nil {
					if !errors.Is(err, ErrFrameTooLarge) {
						t.Fatalf("receipt %d: %v", i, err)
					}
					continue
				}
				want = append(want, before)
			}
			readAsSent(t, l, want)
		})
	}
}

// Senders racing on one control lane with 20 signers: every receipt reads
// back as sent, each sender's in its order (no receipt before the name it
// uses).
func TestSignersFromConcurrentSenders(t *testing.T) {
	l := controlLane(true, 1<<20)
	l.c.t.cfg.SendQueueBytes = 1 << 30
	const senders, each = 8, 300
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			for i := range each {
				if err := l.enqueueReceipt(signedReceipt(g*each+i, (g*7+i)%20, 300+(g*13+i)%200)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := readReceipts(t, laneBytes(l))
	if len(got) != senders*each {
		t.Fatalf("%d receipts read, %d sent", len(got), senders*each)
	}
	next := make([]int, senders)
	for _, rc := range got {
		var k int
		if _, err := fmt.Sscanf(rc.GetMsgId(), "m%d", &k); err != nil {
			t.Fatal(err)
		}
		g, i := k/each, k%each
		if i != next[g] {
			t.Fatalf("sender %d: receipt %d where %d was next", g, i, next[g])
		}
		next[g]++
		if want := signedReceipt(k, (g*7+i)%20, 300+(g*13+i)%200); !proto.Equal(rc, want) {
			t.Fatalf("receipt %d: %v, want %v", k, rc, want)
		}
	}
}

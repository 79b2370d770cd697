package transport_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// forwarder is b's handler in the forward tests: every envelope for node
// c goes on with Forward, and c's receipt comes back unchanged; when
// Forward cannot take it, an unsigned CODE_UNSPECIFIED receipt says why.
// The node is set once it has started; the handler's goroutines learn of
// it through the atomic (an envelope's arrival over the network is no
// happens-before edge the race detector can see).
type forwarder struct {
	n  atomic.Pointer[node]
	to string
}

func (f *forwarder) HandleEnvelope(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	n := f.n.Load()
	if n == nil {
		reply(&pb.Receipt{Message: "forwarder not started"})
		return
	}
	err := n.Forward(f.to, env, 5*time.Second, func(rc *pb.Receipt, err error) {
		if err != nil {
			rc = &pb.Receipt{Message: err.Error()}
		}
		reply(rc)
	})
	if err != nil {
		reply(&pb.Receipt{Message: err.Error()})
	}
}

// Envelopes forwarded for one recipient reach it in order, each receipt
// comes back to the first sender unchanged, and the first Forward without
// a connection returns at once while a dial starts.
func TestForwardCarriesEnvelopesAndReceipts(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	rec := &recorder{}
	c := startNode(t, testConfig(t, ca, "c"), r, rec)
	fw := &forwarder{to: "c"}
	b := startNode(t, testConfig(t, ca, "b"), r, fw)
	fw.n.Store(b)
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	_ = c

	start := time.Now()
	rc, err := a.Request(ctxT(t, 5*time.Second), "b", envTo(t, "sink@c", pb.Envelope_RECEIPT_PROCESSED))
	if err != nil {
		t.Fatal(err)
	}
	if rc.GetCode() != pb.Receipt_CODE_UNSPECIFIED || rc.GetMessage() == "" {
		t.Fatalf("first forward without a connection: %v, want a refusal", rc)
	}
	t.Logf("first forward refused after %v: %s", time.Since(start), rc.GetMessage())
	testutil.WaitFor(t, 5*time.Second, "b connected to c", func() bool { ok, _ := transport.ConnInfo(b.Transport, "c"); return ok })

	envs := make([]*pb.Envelope, 50)
	for i := range envs {
		envs[i] = envTo(t, "sink@c", pb.Envelope_RECEIPT_PROCESSED)
	}
	rcs, err := a.RequestBatch(ctxT(t, 10*time.Second), "b", envs)
	if err != nil {
		t.Fatal(err)
	}
	for i, rc := range rcs {
		// The recorder answers PROCESSED with the recipient as message: it
		// came from c.
		if rc.GetCode() != pb.Receipt_PROCESSED || rc.GetMessage() != "sink@c" || rc.GetMsgId() != envs[i].GetMsgId() {
			t.Fatalf("receipt %d: %v", i, rc)
		}
	}
	got, from := rec.snapshot()
	if len(got) != len(envs) { // the first one was refused by b, never sent
		t.Fatalf("c got %d envelopes, want %d", len(got), len(envs))
	}
	for i := range envs {
		if got[i].GetMsgId() != envs[i].GetMsgId() {
			t.Fatalf("c got envelope %d out of order: %s, want %s", i, got[i].GetMsgId(), envs[i].GetMsgId())
		}
		if from[i].Name != "b" {
			t.Fatalf("c got envelope %d from %s, want the forwarder b", i, from[i].Name)
		}
	}
}

// Forward never blocks and never calls done when it returns an error.
func TestForwardRefusesWithoutBlocking(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	b := startNode(t, testConfig(t, ca, "b"), r, &recorder{})
	called := make(chan struct{}, 1)
	done := func(*pb.Receipt, error) { called <- struct{}{} }
	start := time.Now()
	if err := b.Forward("nobody", envTo(t, "x@nobody", pb.Envelope_RECEIPT_PROCESSED), time.Second, done); !errors.Is(err, transport.ErrUnreachable) {
		t.Fatalf("forward to an unknown node: %v, want ErrUnreachable", err)
	}
	if err := b.Forward("nobody", envTo(t, "x@nobody", pb.Envelope_RECEIPT_NONE), time.Second, done); !errors.Is(err, transport.ErrBadEnvelope) {
		t.Fatalf("forward without a receipt: %v, want ErrBadEnvelope", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("forward blocked for %v", d)
	}
	select {
	case <-called:
		t.Fatal("done called after an error")
	default:
	}
}

// Redial proves a path with a fresh handshake: it fails while the peer's
// packets are dropped, whatever connection existed, and succeeds once
// they flow again.
func TestRedialProbesThePath(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	hole := &blackhole{}
	cfgB := testConfig(t, ca, "b")
	cfgB.WrapPacketConn = func(pc net.PacketConn) net.PacketConn { hole.PacketConn = pc; return hole }
	startNode(t, cfgB, r, &recorder{})
	cfgA := testConfig(t, ca, "a")
	cfgA.HandshakeTimeout = 500 * time.Millisecond
	a := startNode(t, cfgA, r, &recorder{})
	if _, err := a.Request(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	if err := a.Redial(ctxT(t, 5*time.Second), "b"); err != nil {
		t.Fatalf("redial of a reachable peer: %v", err)
	}
	hole.drop.Store(true)
	start := time.Now()
	if err := a.Redial(ctxT(t, 5*time.Second), "b"); !errors.Is(err, transport.ErrUnreachable) {
		t.Fatalf("redial through a cut: %v, want ErrUnreachable", err)
	}
	t.Logf("redial through a cut failed after %v", time.Since(start))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.Redial(ctx, "b"); err == nil {
		t.Fatal("redial with a cancelled context succeeded")
	}
	hole.drop.Store(false)
	testutil.WaitFor(t, 10*time.Second, "redial succeeds after the heal", func() bool {
		return a.Redial(ctxT(t, 5*time.Second), "b") == nil
	})
	rc, err := a.Request(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED))
	if err != nil || rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatal(fmt.Errorf("request after the heal: %v %w", rc, err))
	}
}

// A forwarder carries an envelope exactly as its sender sent it, so one
// that fills the frame limit to the byte goes on: the sender kept room for
// what each sending adds when it accepted the message, and a forwarder
// that kept that room again refused the largest messages senders accept.
func TestForwardCarriesAnEnvelopeThatFillsTheFrame(t *testing.T) {
	const frame = 8192
	ca := newCA(t)
	r := newResolver()
	small := func(name string) transport.Config {
		cfg := testConfig(t, ca, name)
		cfg.MaxFrameSize = frame
		return cfg
	}
	rec := &recorder{}
	startNode(t, small("c"), r, rec)
	fw := &forwarder{to: "c"}
	b := startNode(t, small("b"), r, fw)
	fw.n.Store(b)
	a := startNode(t, small("a"), r, &recorder{})
	// The first forward finds no connection to c and starts the dial.
	if _, err := a.Request(ctxT(t, 5*time.Second), "b", envTo(t, "sink@c", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "b connected to c", func() bool { ok, _ := transport.ConnInfo(b.Transport, "c"); return ok })

	env := envTo(t, "sink@c", pb.Envelope_RECEIPT_PROCESSED)
	var fits *pb.Envelope
	for pad := frame - 256; pad < frame; pad++ {
		body, err := anypb.New(wrapperspb.Bytes(make([]byte, pad)))
		if err != nil {
			t.Fatal(err)
		}
		env.Body = body
		if a.CheckSendTo(env, "b") != nil {
			break
		}
		fits = proto.CloneOf(env)
	}
	if fits == nil || a.CheckSendTo(env, "b") == nil {
		t.Fatal("found no envelope that fills the frame to the byte")
	}
	rc, err := a.Request(ctxT(t, 5*time.Second), "b", fits)
	if err != nil {
		t.Fatal(err)
	}
	if rc.GetCode() != pb.Receipt_PROCESSED || rc.GetMessage() != "sink@c" {
		t.Fatalf("an envelope of %d bytes, the frame limit's largest: %v, want PROCESSED by c", proto.Size(fits), rc)
	}
}

package transport_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/rawpeer"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// signingPair starts a and b, whose handler answers every request with a
// receipt of text signed, in turn, by one of signers (identities of the
// cluster's CA), as a node answers a forwarded message, on a goroutine of
// its own (so that replies race on the control lane). a's Hello lists
// features (nil: all of them), and edit changes a's config. It returns a
// verifier of the cluster's CA.
func signingPair(t *testing.T, features []string, signers int, text string, edit func(*transport.Config)) (a, b *node, v *transport.Verifier) {
	t.Helper()
	ca, r := newCA(t), newResolver()
	ids := make([]transport.Identity, signers)
	for i := range ids {
		id, err := ca.NewIdentity(fmt.Sprint("signer", i))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	cfg := testConfig(t, ca, "a")
	if features != nil {
		transport.SetHelloHook(&cfg, func(h *pb.Hello) { h.Features = features })
	}
	if edit != nil {
		edit(&cfg)
	}
	a = startNode(t, cfg, r, &recorder{})
	var answered atomic.Int64
	b = startNode(t, testConfig(t, ca, "b"), r, handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		id := ids[int(answered.Add(1)-1)%len(ids)]
		go func() {
			rc := &pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_PROCESSED, Message: text,
				Watermark: env.GetSequence(), WatermarkDigest: env.GetSequence() * 31}
			if err := transport.SignReceipt(&id.Cert, id.Name, rc, sha256.Sum256([]byte(env.GetMsgId()))); err != nil {
				t.Error(err)
			}
			reply(rc)
		}()
	}))
	return a, b, transport.NewVerifier(ids[0].Roots)
}

// requestSigned sends n requests from a to b, one at a time, checks that
// each receipt is b's, signed by its signer and verified, and returns the
// receipts and the bytes a read from b.
func requestSigned(t *testing.T, a *node, v *transport.Verifier, n int) ([]*pb.Receipt, uint64) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	before := a.PeerStats()["b"].BytesIn
	rcs := make([]*pb.Receipt, n)
	for i := range rcs {
		env := envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED)
		rc, err := a.Request(ctx, "b", env)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		checkSigned(t, v, env, rc)
		rcs[i] = rc
	}
	return rcs, a.PeerStats()["b"].BytesIn - before
}

// checkSigned checks that rc is b's receipt for env, signed by one of the
// signers, and verifies.
func checkSigned(t *testing.T, v *transport.Verifier, env *pb.Envelope, rc *pb.Receipt) {
	t.Helper()
	s := rc.GetSignature()
	if rc.GetCode() != pb.Receipt_PROCESSED || rc.GetWatermark() != env.GetSequence() || !strings.HasPrefix(s.GetNode(), "signer") {
		t.Fatalf("receipt of %s: %v", env.GetMsgId(), rc)
	}
	if err := v.VerifyReceipt(rc, s.GetNode(), sha256.Sum256([]byte(env.GetMsgId()))); err != nil {
		t.Fatalf("receipt of %s: %v", env.GetMsgId(), err)
	}
}

// Receipts for forwarded messages carry their signer's node and
// certificate (most of their bytes): named once per control stream, each
// receipt arrives as signed and verifies. A peer that does not take
// signer names reads them in full.
func TestSignersNamedOncePerStream(t *testing.T) {
	const n, signers = 90, 3
	a, _, v := signingPair(t, nil, signers, "", nil)
	rcs, named := requestSigned(t, a, v, n)
	a2, _, v2 := signingPair(t, []string{transport.FeatureTypeNames, transport.FeatureRouteNames, transport.FeatureOriginNames}, signers, "", nil)
	_, full := requestSigned(t, a2, v2, n)
	// Each receipt leaves out its signer's node and certificate (with
	// their tags and lengths) and says a ref (2 bytes); each signer costs
	// a frame of about as much, once.
	id := len(rcs[0].GetSignature().GetNode()) + len(rcs[0].GetSignature().GetCertificate()) + 4
	if saved, least := int(full)-int(named), (n-signers)*(id-2); saved < least {
		t.Fatalf("signers named: %d bytes, in full: %d; saved %d, want at least %d", named, full, saved, least)
	}
	t.Logf("%d signed receipts: %d bytes read with signers named, %d in full (certificates of %d bytes)",
		n, named, full, len(rcs[0].GetSignature().GetCertificate()))
}

// More signers than a control stream names, and signers past its bytes
// bound, go in full and arrive as signed.
func TestSignersPastTheBoundsGoInFull(t *testing.T) {
	a, _, v := signingPair(t, nil, 25, "", nil) // 25 certificates of about 400 bytes: past 16, and past 8 KiB
	requestSigned(t, a, v, 75)
}

// Batches answered in parallel by 25 signers (past the bounds), their
// receipts racing on the control lane, across redials (names start again
// on each new control stream): every receipt verifies, and no connection
// is closed for bad input.
func TestSignersAcrossBatchesAndRedials(t *testing.T) {
	a, _, v := signingPair(t, nil, 25, "", nil)
	for round := range 4 {
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Go(func() {
				envs := make([]*pb.Envelope, 50)
				for i := range envs {
					envs[i] = envTo(t, fmt.Sprintf("r%d@b", g), pb.Envelope_RECEIPT_PROCESSED)
				}
				rcs, err := a.RequestBatch(ctxT(t, 10*time.Second), "b", envs)
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					return
				}
				for i, rc := range rcs {
					checkSigned(t, v, envs[i], rc)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		if err := a.Redial(ctxT(t, 5*time.Second), "b"); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(a.logs.String(), "bad input from peer") {
		t.Fatalf("a closed a connection on bad input:\n%s", a.logs.String())
	}
}

// A signed receipt with the longest text SignReceipt keeps reaches a peer
// of the smallest frame limit (1 KiB), named or in full: it is not
// dropped, leaving its request to time out and its message to be sent
// again and answered the same way.
func TestSignedReceiptAtTheSmallestFrameLimit(t *testing.T) {
	small := func(c *transport.Config) { c.MaxFrameSize = 1 << 10 }
	for _, features := range [][]string{nil, {}} {
		a, _, v := signingPair(t, features, 1, strings.Repeat("x", 2*transport.MaxSignedReceiptText), small)
		requestSigned(t, a, v, 3)
	}
}

// What a peer names as signers on its control stream is checked: a ref it
// did not name, a name out of order, twice, without a node or a
// certificate, past the bounds, a named receipt without a signature or
// whose signature says a node or certificate of its own, and a signer ref
// on a frame without a receipt close its connection; other peers are not
// touched.
func TestBadSignerNamesCloseTheConnection(t *testing.T) {
	receipt := func(ref uint32, s *pb.ReceiptSignature) *pb.Frame {
		return &pb.Frame{Kind: &pb.Frame_Receipt{Receipt: &pb.Receipt{MsgId: "m1", Code: pb.Receipt_PROCESSED, Signature: s}}, Signer: ref}
	}
	name := func(ref uint32, node string, cert []byte) *pb.Frame {
		return &pb.Frame{Kind: &pb.Frame_SignerName{SignerName: &pb.SignerName{Ref: ref, Node: node, Certificate: cert}}}
	}
	cert := []byte("certificate")
	sig := &pb.ReceiptSignature{Signature: []byte("s")}
	many := make([]*pb.Frame, 17)
	for i := range many {
		many[i] = name(uint32(i+1), fmt.Sprint("s", i), cert)
	}
	for _, tc := range []struct {
		name   string
		frames []*pb.Frame
	}{
		{"a ref not named", []*pb.Frame{receipt(1, sig)}},
		{"a ref past those named", []*pb.Frame{name(1, "s", cert), receipt(2, sig)}},
		{"a name out of order", []*pb.Frame{name(2, "s", cert)}},
		{"a name twice", []*pb.Frame{name(1, "s", cert), name(1, "s", cert)}},
		{"a name without a certificate", []*pb.Frame{name(1, "s", nil)}},
		{"a name without a node", []*pb.Frame{name(1, "", cert)}},
		{"a name too long", []*pb.Frame{name(1, "s", bytes.Repeat([]byte("c"), 8<<10))}},
		{"names too long together", []*pb.Frame{name(1, "s", bytes.Repeat([]byte("c"), 5000)), name(2, "t", bytes.Repeat([]byte("d"), 3200))}},
		{"more names than a stream takes", many},
		{"a named receipt without a signature", []*pb.Frame{name(1, "s", cert), receipt(1, nil)}},
		{"a named receipt whose signature says its node", []*pb.Frame{name(1, "s", cert), receipt(1, &pb.ReceiptSignature{Node: "s", Signature: []byte("s")})}},
		{"a named receipt whose signature says its certificate", []*pb.Frame{name(1, "s", cert), receipt(1, &pb.ReceiptSignature{Certificate: cert})}},
		{"a signer without a receipt", []*pb.Frame{{Kind: &pb.Frame_SignerName{SignerName: &pb.SignerName{Ref: 1, Node: "s", Certificate: cert}}, Signer: 1}}},
		// -1 as an int of 32 bits: on such platforms a bound check of
		// int(ref) took it and the index panicked, ending the process.
		{"the largest ref", []*pb.Frame{name(1, "s", cert), receipt(0xFFFFFFFF, sig)}},
	} {
		t.Run(tc.name, func(t *testing.T) { framesOnCloseTheConnection(t, (*rawpeer.Peer).Control, tc.frames) })
	}
	t.Run("as the rules say", func(t *testing.T) {
		// Named as the rules say (a receipt without a waiter is only
		// logged), the connection stays.
		ca, srv, good, _ := hostileSetup(t, nil)
		evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
		if err := writeFrames(t, evil.Control(), []*pb.Frame{name(1, "s1", cert), name(2, "s2", []byte("other")), receipt(2, sig), receipt(1, proto.CloneOf(sig))}); err != nil {
			t.Fatal(err)
		}
		waitCond(t, 5*time.Second, "the receipts read", func() bool {
			return srv.PeerStats()["evil"].FramesIn >= 4
		})
		if _, _, closed := evil.Closed(200 * time.Millisecond); closed {
			t.Fatal("the connection closed on names within the rules")
		}
		assertGoodPeerWorks(t, srv, good)
	})
}

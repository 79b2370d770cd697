package transport_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// signers is a CA with identities for n1 and n2, and an unrelated CA's n1.
type signers struct {
	ca            *transport.CA
	n1, n2, alien transport.Identity
}

func newSigners(tb testing.TB) signers {
	tb.Helper()
	ca, err := transport.NewCA("origin test", time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	other, err := transport.NewCA("another cluster", time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	var s signers
	s.ca = ca
	for _, x := range []struct {
		ca   *transport.CA
		name string
		id   *transport.Identity
	}{{ca, "n1", &s.n1}, {ca, "n2", &s.n2}, {other, "n1", &s.alien}} {
		if *x.id, err = x.ca.NewIdentity(x.name); err != nil {
			tb.Fatal(err)
		}
	}
	return s
}

// ed25519Identity issues an Ed25519 certificate for name from ca.
func ed25519Identity(tb testing.TB, ca *transport.CA, name string) *tls.Certificate {
	tb.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		tb.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func forwardedEnvelope() *pb.Envelope {
	return &pb.Envelope{
		ProtocolVersion: pb.ProtocolVersion, MsgId: "m-1", IdempotencyKey: "k", Sender: "a@n1", Recipient: "sink@n3",
		CreatedAtUnixMs: 1700000000000, Type: "t", Headers: map[string]string{"h1": "v1", "h2": "v2"},
		Body:     &anypb.Any{TypeUrl: "type.googleapis.com/x", Value: []byte("payload")},
		Rpc:      &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, Service: "s", Method: "m", CorrelationId: "c", ReplyTo: "a@n1"},
		EventSeq: 4, Sequence: 17, Conflict: pb.Envelope_OVERWRITE, Attempt: 2, Receipt: pb.Envelope_RECEIPT_PROCESSED,
		PrevSequence: 16, StreamEpoch: 3, CoalesceKey: "ck", TtlMs: 5000,
	}
}

var outbox1 = bytes.Repeat([]byte{1}, 16)

func TestOriginSignVerify(t *testing.T) {
	s := newSigners(t)
	v := transport.NewVerifier(s.n1.Roots)
	sign := func(tb testing.TB, cert *tls.Certificate, node string) *pb.Envelope {
		tb.Helper()
		env := forwardedEnvelope()
		if _, err := transport.SignOrigin(cert, node, outbox1, env); err != nil {
			tb.Fatal(err)
		}
		return env
	}
	t.Run("valid", func(t *testing.T) {
		for name, cert := range map[string]*tls.Certificate{"ecdsa": &s.n1.Cert, "ed25519": ed25519Identity(t, s.ca, "n1")} {
			env := sign(t, cert, "n1")
			dg, err := v.VerifyOrigin(env)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if want, _ := transport.EnvelopeDigest(env); dg != want {
				t.Fatalf("%s: digest differs", name)
			}
		}
	})
	t.Run("through the codec", func(t *testing.T) {
		// A forwarder decodes and re-encodes what it carries: the digest
		// is over fields, so it survives, whatever the encoder.
		env := sign(t, &s.n1.Cert, "n1")
		for _, enc := range []func([]byte, *pb.Envelope, int) ([]byte, error){transport.AppendEnvelopeFrame, transport.AppendEnvelopeFrameGeneric} {
			b, err := enc(nil, env, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			_, n := protowire.ConsumeVarint(b)
			for _, owned := range []bool{false, true} {
				got, _, _, _, _, err := transport.DecodeEnvelopeFrameOwned(bytes.Clone(b[n:]), owned)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := v.VerifyOrigin(got); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
	tamper := map[string]func(e *pb.Envelope){
		"body":           func(e *pb.Envelope) { e.Body.Value = []byte("pAyload") },
		"body type":      func(e *pb.Envelope) { e.Body.TypeUrl += "y" },
		"no body":        func(e *pb.Envelope) { e.Body = nil },
		"header value":   func(e *pb.Envelope) { e.Headers["h1"] = "v2" },
		"header added":   func(e *pb.Envelope) { e.Headers["h3"] = "" },
		"header moved":   func(e *pb.Envelope) { e.Headers = map[string]string{"h1": "v1h2", "2": "v2"} },
		"sequence":       func(e *pb.Envelope) { e.Sequence++ },
		"prev sequence":  func(e *pb.Envelope) { e.PrevSequence = 0 },
		"epoch":          func(e *pb.Envelope) { e.StreamEpoch++ },
		"msg id":         func(e *pb.Envelope) { e.MsgId = "m-2" },
		"sender":         func(e *pb.Envelope) { e.Sender = "b@n1" },
		"recipient":      func(e *pb.Envelope) { e.Recipient = "other@n3" },
		"ttl":            func(e *pb.Envelope) { e.TtlMs = 500000 },
		"reply to":       func(e *pb.Envelope) { e.Rpc.ReplyTo = "x@n1" },
		"kind":           func(e *pb.Envelope) { e.Rpc.Kind = pb.RpcMeta_EVENT },
		"key":            func(e *pb.Envelope) { e.IdempotencyKey = "" },
		"attempt":        func(e *pb.Envelope) { e.Attempt = 1 },
		"origin node":    func(e *pb.Envelope) { e.Origin.Node = "n2" },
		"origin outbox":  func(e *pb.Envelope) { e.Origin.OutboxId = bytes.Repeat([]byte{2}, 16) },
		"no signature":   func(e *pb.Envelope) { e.Origin.Signature = nil },
		"bad signature":  func(e *pb.Envelope) { e.Origin.Signature = []byte{0x30, 0x00} },
		"no certificate": func(e *pb.Envelope) { e.Origin.Certificate = nil },
		"junk cert":      func(e *pb.Envelope) { e.Origin.Certificate = []byte("not a certificate") },
		"other's cert":   func(e *pb.Envelope) { e.Origin.Certificate = s.n2.Cert.Certificate[0] },
		"unknown field": func(e *pb.Envelope) {
			e.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "x"))
		},
	}
	for name, f := range tamper {
		t.Run("altered "+name, func(t *testing.T) {
			env := sign(t, &s.n1.Cert, "n1")
			f(env)
			if _, err := v.VerifyOrigin(env); !errors.Is(err, transport.ErrBadOrigin) {
				t.Fatalf("verify after altering %s: %v, want ErrBadOrigin", name, err)
			}
		})
	}
	t.Run("wrong key", func(t *testing.T) {
		// n2 signs but claims to be n1, with n1's certificate.
		env := sign(t, &s.n2.Cert, "n2")
		env.Origin.Node, env.Origin.Certificate = "n1", s.n1.Cert.Certificate[0]
		if _, err := v.VerifyOrigin(env); !errors.Is(err, transport.ErrBadOrigin) {
			t.Fatalf("n2's signature as n1: %v", err)
		}
	})
	t.Run("wrong certificate", func(t *testing.T) {
		// n2 signs with its own key and certificate but names n1.
		env := sign(t, &s.n2.Cert, "n1")
		if _, err := v.VerifyOrigin(env); !errors.Is(err, transport.ErrBadOrigin) {
			t.Fatalf("n2's certificate for n1: %v", err)
		}
	})
	t.Run("another CA", func(t *testing.T) {
		env := sign(t, &s.alien.Cert, "n1")
		if _, err := v.VerifyOrigin(env); !errors.Is(err, transport.ErrBadOrigin) {
			t.Fatalf("a certificate of another CA: %v", err)
		}
	})
	t.Run("no origin", func(t *testing.T) {
		if _, err := v.VerifyOrigin(forwardedEnvelope()); !errors.Is(err, transport.ErrBadOrigin) {
			t.Fatalf("no origin: %v", err)
		}
	})
}

func TestReceiptSignVerify(t *testing.T) {
	s := newSigners(t)
	v := transport.NewVerifier(s.n1.Roots)
	env := forwardedEnvelope()
	dg, err := transport.SignOrigin(&s.n1.Cert, "n1", outbox1, env)
	if err != nil {
		t.Fatal(err)
	}
	signed := func(tb testing.TB) *pb.Receipt {
		tb.Helper()
		rc := &pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_DUPLICATE, Message: "m", Watermark: 17, RetryAfterMs: 3}
		if err := transport.SignReceipt(&s.n2.Cert, "n2", rc, dg); err != nil {
			tb.Fatal(err)
		}
		return rc
	}
	if err := v.VerifyReceipt(signed(t), "n2", dg); err != nil {
		t.Fatal(err)
	}
	// Through a receipt frame, as a forwarder passes it on.
	b, err := proto.Marshal(signed(t))
	if err != nil {
		t.Fatal(err)
	}
	var back pb.Receipt
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if err := v.VerifyReceipt(&back, "n2", dg); err != nil {
		t.Fatal(err)
	}
	other := dg
	other[0] ^= 1
	for name, f := range map[string]func(rc *pb.Receipt) (node string, digest [32]byte){
		"code":             func(rc *pb.Receipt) (string, [32]byte) { rc.Code = pb.Receipt_REJECTED; return "n2", dg },
		"watermark":        func(rc *pb.Receipt) (string, [32]byte) { rc.Watermark = 99; return "n2", dg },
		"watermark digest": func(rc *pb.Receipt) (string, [32]byte) { rc.WatermarkDigest = 5; return "n2", dg },
		"msg id":           func(rc *pb.Receipt) (string, [32]byte) { rc.MsgId = "m-2"; return "n2", dg },
		"message":          func(rc *pb.Receipt) (string, [32]byte) { rc.Message = ""; return "n2", dg },
		"retry after":      func(rc *pb.Receipt) (string, [32]byte) { rc.RetryAfterMs = 0; return "n2", dg },
		"another envelope": func(rc *pb.Receipt) (string, [32]byte) { return "n2", other },
		"not the recipient": func(rc *pb.Receipt) (string, [32]byte) {
			return "n3", dg
		},
		"unsigned": func(rc *pb.Receipt) (string, [32]byte) { rc.Signature = nil; return "n2", dg },
		"signer renamed": func(rc *pb.Receipt) (string, [32]byte) {
			rc.Signature.Node = "n1"
			return "n1", dg
		},
		"forwarder's own": func(rc *pb.Receipt) (string, [32]byte) {
			// The forwarder n1 signs a receipt of its own making as n2.
			rc.Code = pb.Receipt_PROCESSED
			if err := transport.SignReceipt(&s.n1.Cert, "n2", rc, dg); err != nil {
				t.Fatal(err)
			}
			return "n2", dg
		},
	} {
		t.Run(name, func(t *testing.T) {
			rc := signed(t)
			node, digest := f(rc)
			if err := v.VerifyReceipt(rc, node, digest); !errors.Is(err, transport.ErrBadOrigin) {
				t.Fatalf("%s: %v, want ErrBadOrigin", name, err)
			}
		})
	}
}

// FuzzVerifyOrigin: forwarded envelopes and signed receipts come from the
// network; whatever they hold, verifying them returns an error or a
// result, never a panic, and never accepts what was not signed.
func FuzzVerifyOrigin(f *testing.F) {
	s := newSigners(f)
	v := transport.NewVerifier(s.n1.Roots)
	env := forwardedEnvelope()
	dg, err := transport.SignOrigin(&s.n1.Cert, "n1", outbox1, env)
	if err != nil {
		f.Fatal(err)
	}
	rc := &pb.Receipt{MsgId: "m-1", Code: pb.Receipt_PROCESSED, Watermark: 17}
	if err := transport.SignReceipt(&s.n2.Cert, "n2", rc, dg); err != nil {
		f.Fatal(err)
	}
	eb, _ := proto.Marshal(env)
	rb, _ := proto.Marshal(rc)
	f.Add(eb, rb)
	f.Add(eb[:len(eb)/2], rb[:len(rb)/2])
	f.Add([]byte{0xaa, 0x01, 0x00}, []byte{0x32, 0x00})
	f.Fuzz(func(t *testing.T, eb, rb []byte) {
		var e pb.Envelope
		if proto.Unmarshal(eb, &e) == nil {
			got, err := v.VerifyOrigin(&e)
			if err == nil {
				if want, _ := transport.EnvelopeDigest(&e); got != want {
					t.Fatal("verified digest is not the envelope's")
				}
				if e.GetOrigin().GetNode() != "n1" {
					t.Fatalf("verified an origin of %q: only n1 signed", e.GetOrigin().GetNode())
				}
			}
		}
		var r pb.Receipt
		if proto.Unmarshal(rb, &r) == nil {
			_ = v.VerifyReceipt(&r, "n2", dg)
		}
	})
}

// A signed receipt's text is cut before it is signed, so it verifies as
// it arrives through a forwarder whose frames to the origin are small: to
// MaxSignedReceiptText, or less where the receipt would not fit a frame
// of the smallest limit (1 KiB) with the signer's certificate.
func TestSignedReceiptTextIsCutBeforeSigning(t *testing.T) {
	s := newSigners(t)
	v := transport.NewVerifier(s.n1.Roots)
	env := forwardedEnvelope()
	dg, err := transport.SignOrigin(&s.n1.Cert, "n1", outbox1, env)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", 4096) // 8 KiB, two bytes a rune
	rc := &pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_REJECTED, Message: long}
	if err := transport.SignReceipt(&s.n2.Cert, "n2", rc, dg); err != nil {
		t.Fatal(err)
	}
	m := rc.GetMessage()
	if len(m) > transport.MaxSignedReceiptText || !utf8.ValidString(m) || !strings.HasPrefix(long, m) {
		t.Fatalf("signed text of %d bytes (valid UTF-8: %v), want a prefix of at most %d", len(m), utf8.ValidString(m), transport.MaxSignedReceiptText)
	}
	frame, err := transport.AppendReceiptFrame(nil, rc, 1<<10)
	if err != nil {
		t.Fatalf("a signed receipt of %d bytes of text: %v", len(m), err)
	}
	// As long as it could be: at the cap, or within a rune and the
	// signature's slack of the smallest limit.
	if len(m) < transport.MaxSignedReceiptText-1 && len(frame) < 1<<10-16 {
		t.Fatalf("signed text cut to %d bytes, its frame %d bytes: longer would have fit", len(m), len(frame))
	}
	t.Logf("signed text of %d bytes, its frame %d bytes", len(m), len(frame))
	if err := v.VerifyReceipt(rc, "n2", dg); err != nil {
		t.Fatal(err)
	}
}

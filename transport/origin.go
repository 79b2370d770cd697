package transport

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"hash"
	"slices"
	"sync"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Forwarded envelopes and their receipts carry signatures so that the
// member in between (the forwarder) can neither forge nor alter them.
//
// What is signed is not the envelope's bytes but a canonical digest of an
// explicit list of its fields (EnvelopeDigest, ReceiptDigest): protobuf
// encodings are not canonical (map order, unknown fields, a library's
// choices), and a forwarder decodes and re-encodes what it carries. Sender
// and receiver agree on the digest because both compute it from the same
// list, in this file. A field added to Envelope later is not covered
// until the list (and its version string) changes; so that nothing
// unsigned is ever acted on, a forwarded envelope or receipt with fields
// this build does not know is refused.

const (
	envelopeDomain = "meshnode/forward/envelope/v1\n"
	receiptDomain  = "meshnode/forward/receipt/v1\n"
	// maxCertDER bounds a certificate read from the network before it is
	// parsed: node certificates are well under 2 KiB.
	maxCertDER = 16 << 10
	// verifiedCap bounds the cache of verified certificates; past it the
	// cache starts again (a cluster has far fewer certificates in use).
	verifiedCap = 1024
)

// digester writes fields into a hash unambiguously: fixed-width integers
// and length-prefixed strings.
type digester struct {
	h   hash.Hash
	buf [8]byte
}

func newDigester(domain string) *digester {
	d := &digester{h: sha256.New()}
	d.h.Write([]byte(domain))
	return d
}

func (d *digester) u64(v uint64) {
	binary.BigEndian.PutUint64(d.buf[:], v)
	d.h.Write(d.buf[:])
}

func (d *digester) str(s string) {
	d.u64(uint64(len(s)))
	d.h.Write([]byte(s))
}

func (d *digester) bytes(b []byte) {
	d.u64(uint64(len(b)))
	d.h.Write(b)
}

func (d *digester) sum() (out [32]byte) {
	d.h.Sum(out[:0])
	return out
}

// EnvelopeDigest is the SHA-256 digest that origin.signature signs: every
// field of env and of its origin except origin.signature, in a fixed order
// (headers sorted by key). It fails for an envelope with fields this build
// does not know, which it could not cover.
func EnvelopeDigest(env *pb.Envelope) ([32]byte, error) {
	if len(env.ProtoReflect().GetUnknown()) > 0 || len(env.GetRpc().ProtoReflect().GetUnknown()) > 0 ||
		len(env.GetBody().ProtoReflect().GetUnknown()) > 0 || len(env.GetOrigin().ProtoReflect().GetUnknown()) > 0 {
		return [32]byte{}, fmt.Errorf("%w: the envelope has fields this node cannot check", ErrBadOrigin)
	}
	d := newDigester(envelopeDomain)
	d.u64(uint64(env.GetProtocolVersion()))
	d.str(env.GetMsgId())
	d.str(env.GetIdempotencyKey())
	d.str(env.GetSender())
	d.str(env.GetRecipient())
	d.u64(uint64(env.GetCreatedAtUnixMs()))
	d.str(env.GetType())
	keys := make([]string, 0, len(env.GetHeaders()))
	for k := range env.GetHeaders() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	d.u64(uint64(len(keys)))
	for _, k := range keys {
		d.str(k)
		d.str(env.GetHeaders()[k])
	}
	digestAny(d, env.GetBody())
	if r := env.GetRpc(); r != nil {
		d.u64(1)
		d.u64(uint64(r.GetKind()))
		d.str(r.GetService())
		d.str(r.GetMethod())
		d.str(r.GetCorrelationId())
		d.str(r.GetReplyTo())
	} else {
		d.u64(0)
	}
	d.u64(env.GetEventSeq())
	d.u64(env.GetSequence())
	d.u64(uint64(env.GetConflict()))
	d.u64(uint64(env.GetAttempt()))
	d.u64(uint64(env.GetReceipt()))
	d.u64(env.GetPrevSequence())
	d.u64(env.GetStreamEpoch())
	d.str(env.GetCoalesceKey())
	d.u64(uint64(env.GetTtlMs()))
	o := env.GetOrigin()
	d.str(o.GetNode())
	d.bytes(o.GetOutboxId())
	d.bytes(o.GetCertificate())
	return d.sum(), nil
}

func digestAny(d *digester, a *anypb.Any) {
	if a == nil {
		d.u64(0)
		return
	}
	d.u64(1)
	d.str(a.GetTypeUrl())
	d.bytes(a.GetValue())
}

// ReceiptDigest is the SHA-256 digest that a receipt's signature signs:
// the signing node, the digest of the envelope it answers (so it is bound
// to that envelope, not only to its msg id) and every field of the receipt
// but the signature.
func ReceiptDigest(rc *pb.Receipt, signer string, envDigest [32]byte) [32]byte {
	d := newDigester(receiptDomain)
	d.str(signer)
	d.h.Write(envDigest[:])
	d.str(rc.GetMsgId())
	d.u64(uint64(rc.GetCode()))
	d.u64(uint64(rc.GetRetryAfterMs()))
	d.str(rc.GetMessage())
	d.u64(rc.GetWatermark())
	if wd := rc.GetWatermarkDigest(); wd != 0 {
		// Covered when set, so that a forwarder can neither add one (a
		// sender takes a digest of another message for a restore of its
		// own outbox) nor strip one; a receipt without one (signed by an
		// older release) hashes as before.
		d.u64(wd)
	}
	return d.sum()
}

// SignOrigin sets env.Origin to node, outboxID and cert's leaf, and signs
// the envelope with cert's private key (ECDSA, Ed25519 or RSA). It returns
// the digest it signed, which the receipts for env are bound to. env must
// not be changed afterwards.
func SignOrigin(cert *tls.Certificate, node string, outboxID []byte, env *pb.Envelope) ([32]byte, error) {
	if cert == nil || len(cert.Certificate) == 0 {
		return [32]byte{}, fmt.Errorf("transport: sign origin: no certificate")
	}
	env.Origin = &pb.Origin{Node: node, OutboxId: outboxID, Certificate: cert.Certificate[0]}
	dg, err := EnvelopeDigest(env)
	if err != nil {
		env.Origin = nil
		return [32]byte{}, fmt.Errorf("transport: sign origin: %w", err)
	}
	sig, err := signDigest(cert, dg)
	if err != nil {
		env.Origin = nil
		return [32]byte{}, fmt.Errorf("transport: sign origin: %w", err)
	}
	env.Origin.Signature = sig
	return dg, nil
}

// MaxSignedReceiptText is the most of a receipt's text SignReceipt keeps.
// A signed receipt reaches the origin through a forwarder, whose frame
// limit towards the origin the signer does not know, and a forwarder
// cannot cut a signed text to fit without breaking the signature; so the
// signer cuts it: to this, and further when the receipt, its certificate
// and signature included, would not fit the smallest frame limit a node
// takes (1 KiB) otherwise.
const MaxSignedReceiptText = 512

// SignReceipt signs rc as node's answer to the envelope whose digest is
// envDigest, with cert's private key, its text cut first (to
// MaxSignedReceiptText bytes at most, to less where the signed receipt
// would not fit a frame of the smallest limit).
func SignReceipt(cert *tls.Certificate, node string, rc *pb.Receipt, envDigest [32]byte) error {
	if cert == nil || len(cert.Certificate) == 0 {
		return fmt.Errorf("transport: sign receipt: no certificate")
	}
	text := rc.Message
	rc.Message = ""
	rc.Signature = &pb.ReceiptSignature{Node: node, Certificate: cert.Certificate[0], Signature: make([]byte, maxSignatureLen(cert))}
	// What the receipt takes in a frame without its text, and its text's
	// tag and length (at most 3 bytes for what fits).
	rest := protowire.SizeTag(frameFieldReceipt) + protowire.SizeBytes(proto.Size(rc)) + 3
	rc.Message = cutUTF8(text, min(MaxSignedReceiptText, minFrameSize-rest))
	rc.Signature = nil
	sig, err := signDigest(cert, ReceiptDigest(rc, node, envDigest))
	if err != nil {
		return fmt.Errorf("transport: sign receipt: %w", err)
	}
	rc.Signature = &pb.ReceiptSignature{Node: node, Certificate: cert.Certificate[0], Signature: sig}
	return nil
}

// signDigest signs a SHA-256 digest with the certificate's key: ECDSA
// (ASN.1) and RSA (PKCS #1 v1.5) sign it as a SHA-256 hash, Ed25519 signs
// its 32 bytes as the message.
func signDigest(cert *tls.Certificate, dg [32]byte) ([]byte, error) {
	switch k := cert.PrivateKey.(type) {
	case *ecdsa.PrivateKey:
		return ecdsa.SignASN1(rand.Reader, k, dg[:])
	case ed25519.PrivateKey:
		return ed25519.Sign(k, dg[:]), nil
	case *rsa.PrivateKey:
		return rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, dg[:])
	}
	return nil, fmt.Errorf("%w: keys of type %T cannot sign", ErrBadOrigin, cert.PrivateKey)
}

// maxSignatureLen bounds the length of a signature signDigest makes with
// cert's key (an ASN.1 ECDSA signature is at most two integers of the
// curve's size plus 9 bytes of framing).
func maxSignatureLen(cert *tls.Certificate) int {
	switch k := cert.PrivateKey.(type) {
	case *ecdsa.PrivateKey:
		return 2*((k.Curve.Params().BitSize+7)/8) + 9
	case ed25519.PrivateKey:
		return ed25519.SignatureSize
	case *rsa.PrivateKey:
		return k.Size()
	}
	return 0
}

// CanSign reports whether cert's key is of a type SignOrigin supports.
func CanSign(cert *tls.Certificate) bool {
	if cert == nil || len(cert.Certificate) == 0 {
		return false
	}
	switch cert.PrivateKey.(type) {
	case *ecdsa.PrivateKey, ed25519.PrivateKey, *rsa.PrivateKey:
		return true
	}
	return false
}

func verifyDigest(leaf *x509.Certificate, dg [32]byte, sig []byte) bool {
	switch k := leaf.PublicKey.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, dg[:], sig)
	case ed25519.PublicKey:
		return ed25519.Verify(k, dg[:], sig)
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, dg[:], sig) == nil
	}
	return false
}

// Verifier checks origins and receipt signatures against the cluster CA.
// Certificates that verified are remembered (by their SHA-256) until they
// expire, so a stream of forwarded envelopes pays for one chain
// verification and one signature check each. Safe for concurrent use.
type Verifier struct {
	roots *x509.CertPool
	now   func() time.Time

	// mu guards the field below.
	mu       sync.Mutex
	verified map[[32]byte]*x509.Certificate
}

// NewVerifier returns a Verifier for certificates of roots.
func NewVerifier(roots *x509.CertPool) *Verifier {
	return &Verifier{roots: roots, now: time.Now, verified: map[[32]byte]*x509.Certificate{}}
}

// certificate parses der and checks that it chains to the roots, is valid
// now and names node.
func (v *Verifier) certificate(der []byte, node string) (*x509.Certificate, error) {
	if len(der) == 0 || len(der) > maxCertDER {
		return nil, fmt.Errorf("%w: a certificate of %d bytes", ErrBadOrigin, len(der))
	}
	if node == "" {
		return nil, fmt.Errorf("%w: no node named", ErrBadOrigin)
	}
	key := sha256.Sum256(der)
	now := v.now()
	v.mu.Lock()
	leaf := v.verified[key]
	v.mu.Unlock()
	if leaf == nil || now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		var err error
		if leaf, err = x509.ParseCertificate(der); err != nil {
			return nil, fmt.Errorf("%w: certificate: %w", ErrBadOrigin, err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: v.roots, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return nil, fmt.Errorf("%w: certificate not from the cluster CA: %w", ErrBadOrigin, err)
		}
		v.mu.Lock()
		if len(v.verified) >= verifiedCap {
			clear(v.verified)
		}
		v.verified[key] = leaf
		v.mu.Unlock()
	}
	if !slices.Contains(leaf.DNSNames, node) {
		return nil, fmt.Errorf("%w: the certificate is not %s's", ErrBadOrigin, node)
	}
	return leaf, nil
}

// VerifyOrigin checks a forwarded envelope: its origin's certificate
// chains to the cluster CA and names origin.node, and origin.signature is
// that certificate key's over EnvelopeDigest. It returns the digest, to
// which the receipt is bound. Errors wrap ErrBadOrigin.
func (v *Verifier) VerifyOrigin(env *pb.Envelope) ([32]byte, error) {
	o := env.GetOrigin()
	if o == nil {
		return [32]byte{}, fmt.Errorf("%w: no origin", ErrBadOrigin)
	}
	leaf, err := v.certificate(o.GetCertificate(), o.GetNode())
	if err != nil {
		return [32]byte{}, err
	}
	dg, err := EnvelopeDigest(env)
	if err != nil {
		return [32]byte{}, err
	}
	if !verifyDigest(leaf, dg, o.GetSignature()) {
		return [32]byte{}, fmt.Errorf("%w: the signature of %s does not match the envelope", ErrBadOrigin, o.GetNode())
	}
	return dg, nil
}

// VerifyReceipt checks that rc is signed by node (its certificate from the
// cluster CA) as its answer to the envelope whose digest is envDigest.
// Errors wrap ErrBadOrigin.
func (v *Verifier) VerifyReceipt(rc *pb.Receipt, node string, envDigest [32]byte) error {
	s := rc.GetSignature()
	switch {
	case s == nil:
		return fmt.Errorf("%w: the receipt is not signed", ErrBadOrigin)
	case s.GetNode() != node:
		return fmt.Errorf("%w: the receipt is signed by %q, not by %s", ErrBadOrigin, s.GetNode(), node)
	case len(rc.ProtoReflect().GetUnknown()) > 0 || len(s.ProtoReflect().GetUnknown()) > 0:
		return fmt.Errorf("%w: the receipt has fields this node cannot check", ErrBadOrigin)
	}
	leaf, err := v.certificate(s.GetCertificate(), node)
	if err != nil {
		return err
	}
	if !verifyDigest(leaf, ReceiptDigest(rc, node, envDigest), s.GetSignature()) {
		return fmt.Errorf("%w: the signature of %s does not match the receipt", ErrBadOrigin, node)
	}
	return nil
}

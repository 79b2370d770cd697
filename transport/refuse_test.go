package transport_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"github.com/quic-go/quic-go"
)

func TestOtherCARefused(t *testing.T) {
	r := newResolver()
	recA, recB := &recorder{}, &recorder{}
	a := startNode(t, testConfig(t, newCA(t), "a"), r, recA)
	b := startNode(t, testConfig(t, newCA(t), "b"), r, recB)
	ctx := ctxT(t, 5*time.Second)
	for _, tc := range []struct {
		from *node
		to   string
	}{{a, "b"}, {b, "a"}} {
		err := tc.from.Send(ctx, tc.to, envTo(t, "x@"+tc.to, pb.Envelope_RECEIPT_NONE))
		if !errors.Is(err, transport.ErrUnreachable) {
			t.Fatalf("%s -> %s: err = %v, want ErrUnreachable", tc.from.name, tc.to, err)
		}
		if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("%s -> %s: error does not name the certificate problem: %v", tc.from.name, tc.to, err)
		}
	}
	if recA.count.Load() != 0 || recB.count.Load() != 0 {
		t.Fatal("an envelope crossed between clusters of different CAs")
	}
}

// TestClientCertFromOtherCARefused skips server verification on the client
// side (the only InsecureSkipVerify in the package) to show that the server
// still refuses a client certificate from another CA.
func TestClientCertFromOtherCARefused(t *testing.T) {
	r := newResolver()
	a := startNode(t, testConfig(t, newCA(t), "a"), r, &recorder{})
	evil, err := newCA(t).NewIdentity("evil")
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{
		Certificates:       []tls.Certificate{evil.Cert},
		InsecureSkipVerify: true,
		NextProtos:         []string{transport.ALPN},
		MinVersion:         tls.VersionTLS13,
	}
	qc, err := quic.DialAddr(ctxT(t, 3*time.Second), a.LocalAddr().String(), tc, &quic.Config{HandshakeIdleTimeout: 2 * time.Second})
	if err == nil {
		// TLS 1.3: the client may finish before the server checks its
		// certificate; then the connection dies right away.
		<-qc.Context().Done()
		err = context.Cause(qc.Context())
		_ = qc.CloseWithError(0, "")
	}
	var te *quic.TransportError
	if !errors.As(err, &te) || !te.Remote {
		t.Fatalf("err = %v, want a handshake error from the server", err)
	}
}

func TestNameMismatchRefused(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	rec := &recorder{}
	n1 := startNode(t, testConfig(t, ca, "n1"), r, rec)
	startNode(t, testConfig(t, ca, "n2"), r, &recorder{}) // the real n2
	// n3 holds a valid certificate for n3 but calls itself n2.
	cfg := testConfig(t, ca, "n3")
	transport.SetHelloHook(&cfg, func(h *pb.Hello) { h.NodeName = "n2" })
	imp := startNode(t, cfg, r, &recorder{})
	err := imp.Send(ctxT(t, 5*time.Second), "n1", envTo(t, "x@n1", pb.Envelope_RECEIPT_NONE))
	if !errors.Is(err, transport.ErrIncompatible) {
		t.Fatalf("err = %v, want ErrIncompatible", err)
	}
	testutil.WaitFor(t, 2*time.Second, "n1 logs the mismatch", func() bool {
		return strings.Contains(n1.logs.String(), "peer claims n2 but certificate is for n3")
	})
	if rec.count.Load() != 0 {
		t.Fatal("impostor's envelope was delivered")
	}
	// n1 still talks to the real n2.
	if _, err := n1.Request(ctxT(t, 5*time.Second), "n2", envTo(t, "x@n2", pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
		t.Fatalf("n1 -> n2 after refusing the impostor: %v", err)
	}
}

func TestIncompatibleRefused(t *testing.T) {
	cases := []struct {
		name string
		hook func(*pb.Hello)
		log  string
	}{
		{"protocol version", func(h *pb.Hello) { h.ProtocolVersions = []uint32{99} }, "protocol versions [99]"},
		{"cluster", func(h *pb.Hello) { h.Cluster = "other" }, "in cluster"},
	}
	for _, tc := range cases {
		for _, odd := range []string{"dialer", "acceptor"} {
			t.Run(tc.name+"/"+odd, func(t *testing.T) {
				ca := newCA(t)
				r := newResolver()
				cfgOdd := testConfig(t, ca, "odd")
				transport.SetHelloHook(&cfgOdd, tc.hook)
				recOdd, recOK := &recorder{}, &recorder{}
				o := startNode(t, cfgOdd, r, recOdd)
				k := startNode(t, testConfig(t, ca, "ok"), r, recOK)
				from, to, refuser := o, "ok", k
				if odd == "acceptor" {
					from, to, refuser = k, "odd", k
				}
				err := from.Send(ctxT(t, 5*time.Second), to, envTo(t, "x@"+to, pb.Envelope_RECEIPT_NONE))
				if !errors.Is(err, transport.ErrIncompatible) {
					t.Fatalf("err = %v, want ErrIncompatible", err)
				}
				testutil.WaitFor(t, 2*time.Second, "refusal logged", func() bool {
					return strings.Contains(refuser.logs.String(), tc.log)
				})
				if recOdd.count.Load()+recOK.count.Load() != 0 {
					t.Fatal("envelope delivered across an incompatible connection")
				}
			})
		}
	}
}

// rawPeer connects to a transport with plain quic-go, as node "evil" with a
// valid certificate, and completes the Hello exchange.
func rawPeer(tb testing.TB, ca *transport.CA, target *node) *quic.Conn {
	tb.Helper()
	id, err := ca.NewIdentity("evil")
	if err != nil {
		tb.Fatal(err)
	}
	tc := &tls.Config{
		Certificates: []tls.Certificate{id.Cert},
		RootCAs:      id.Roots,
		ServerName:   target.name,
		NextProtos:   []string{transport.ALPN},
		MinVersion:   tls.VersionTLS13,
	}
	ctx := ctxT(tb, 5*time.Second)
	qc, err := quic.DialAddr(ctx, target.LocalAddr().String(), tc, &quic.Config{MaxIdleTimeout: 5 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = qc.CloseWithError(0, "") })
	s, err := qc.OpenUniStreamSync(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	hello, err := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Hello{Hello: &pb.Hello{
		NodeName: "evil", BootId: "1", ProtocolVersions: pb.SupportedVersions(), Cluster: target.cfg.Cluster, OutboxId: bytes.Repeat([]byte{7}, 16),
	}}})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := s.Write(hello); err != nil {
		tb.Fatal(err)
	}
	rs, err := qc.AcceptUniStream(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var f pb.Frame
	if _, err := transport.ReadFrame(bufio.NewReader(rs), 1<<20, &f); err != nil || f.GetHello().GetNodeName() != target.name {
		tb.Fatalf("server hello: %v %v", f.GetHello(), err)
	}
	return qc
}

func TestBadFramesCloseOnlyThatConnection(t *testing.T) {
	cases := []struct {
		name  string
		bytes func(max int) []byte
		code  quic.ApplicationErrorCode
	}{
		{"oversized", func(max int) []byte { return appendUvarint(nil, uint64(max)+1) }, transport.CodeFrameTooLarge},
		{"garbage", func(int) []byte { return []byte{5, 0xff, 0xff, 0xff, 0xff, 0xff} }, transport.CodeProtocol},
		{"varint overflow", func(int) []byte {
			return []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}
		}, transport.CodeProtocol},
		{"hello on a lane", func(int) []byte {
			b, _ := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Hello{Hello: &pb.Hello{NodeName: "x"}}})
			return b
		}, transport.CodeProtocol},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ca := newCA(t)
			r := newResolver()
			rec := &recorder{}
			srv := startNode(t, testConfig(t, ca, "srv"), r, rec)
			good := startNode(t, testConfig(t, ca, "good"), r, &recorder{})
			if _, err := good.Request(ctxT(t, 5*time.Second), "srv", envTo(t, "x@srv", pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
				t.Fatal(err)
			}
			qc := rawPeer(t, ca, srv)
			s, err := qc.OpenUniStreamSync(ctxT(t, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(tc.bytes(srv.cfg.MaxFrameSize)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-qc.Context().Done():
			case <-time.After(5 * time.Second):
				t.Fatal("server did not close the connection")
			}
			var ae *quic.ApplicationError
			if err := context.Cause(qc.Context()); !errors.As(err, &ae) || ae.ErrorCode != tc.code {
				t.Fatalf("close cause %v, want application code %d", err, tc.code)
			}
			// The good peer keeps working on its connection.
			if _, err := good.Request(ctxT(t, 5*time.Second), "srv", envTo(t, "x@srv", pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
				t.Fatalf("good peer after bad frames: %v", err)
			}
			if ok, _ := transport.ConnInfo(srv.Transport, "good"); !ok {
				t.Fatal("server lost its connection to the good peer")
			}
		})
	}
}

func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

var _ = net.IPv4len

// Package rawpeer is a peer written as an attacker would write one: plain
// quic-go with a certificate of the cluster CA (or another one), the Hello
// exchange done by hand, and frames of its choosing on streams of its
// choosing. Tests of hostile input use it against real nodes; it is not
// public API.
package rawpeer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"github.com/quic-go/quic-go"
)

// Peer is an established connection that passed the target's Hello checks.
type Peer struct {
	Name    string
	Conn    *quic.Conn
	control *bufio.Reader    // the target's control stream: its Hello was read, receipts follow
	ours    *quic.SendStream // our control stream: our Hello was written
}

// Target is what the attacker knows about the node it connects to.
type Target struct {
	Addr    string // QUIC address
	Name    string // node name (its certificate's)
	Cluster string
}

// ClientTLS returns the TLS config of a client holding id (a zero
// Identity sends no certificate), verifying the server against roots. The
// certificate is sent whatever CAs the server asks for, as an attacker
// would (crypto/tls's own choice would send none from another CA).
func ClientTLS(id transport.Identity, serverName string) *tls.Config {
	cert := id.Cert
	return &tls.Config{
		RootCAs:    id.Roots,
		ServerName: serverName,
		NextProtos: []string{transport.ALPN},
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &cert, nil // an empty one sends none
		},
	}
}

// Dial connects to tgt as name, with a certificate for name from ca, and
// completes the Hello exchange. The connection is closed at cleanup.
func Dial(tb testing.TB, ca *transport.CA, name string, tgt Target) *Peer {
	tb.Helper()
	id, err := ca.NewIdentity(name)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	qc, err := quic.DialAddr(ctx, tgt.Addr, ClientTLS(id, tgt.Name), &quic.Config{
		MaxIdleTimeout:  10 * time.Second,
		KeepAlivePeriod: time.Second,
	})
	if err != nil {
		tb.Fatalf("rawpeer: dial %s: %v", tgt.Addr, err)
	}
	tb.Cleanup(func() { _ = qc.CloseWithError(0, "") })
	s, err := qc.OpenUniStreamSync(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	p := &Peer{Name: name, Conn: qc, ours: s}
	hello, err := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Hello{Hello: &pb.Hello{
		NodeName: name, BootId: "raw-" + name, ProtocolVersions: pb.SupportedVersions(),
		Cluster: tgt.Cluster, OutboxId: bytes.Repeat([]byte{7}, 16),
	}}})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := s.Write(hello); err != nil {
		tb.Fatal(err)
	}
	rs, err := qc.AcceptUniStream(ctx)
	if err != nil {
		tb.Fatalf("rawpeer: the target sent no Hello: %v", err)
	}
	p.control = bufio.NewReader(rs)
	var f pb.Frame
	if _, err := transport.ReadFrame(p.control, 1<<20, &f); err != nil || f.GetHello().GetNodeName() != tgt.Name {
		tb.Fatalf("rawpeer: server hello: %v %v", f.GetHello(), err)
	}
	return p
}

// Control is the peer's own control stream, after its Hello: receipts
// and GoAway are written on it.
func (p *Peer) Control() *quic.SendStream { return p.ours }

// Lane opens a new stream to write frames on.
func (p *Peer) Lane(tb testing.TB) *quic.SendStream {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := p.Conn.OpenUniStreamSync(ctx)
	if err != nil {
		tb.Fatalf("rawpeer: open stream: %v", err)
	}
	return s
}

// Send writes env as one frame on s.
func (p *Peer) Send(tb testing.TB, s *quic.SendStream, env *pb.Envelope) {
	tb.Helper()
	if err := p.TrySend(s, env); err != nil {
		tb.Fatal(err)
	}
}

// TrySend is Send returning the error, for goroutines.
func (p *Peer) TrySend(s *quic.SendStream, env *pb.Envelope) error {
	b, err := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: env}})
	if err != nil {
		return fmt.Errorf("rawpeer: encode: %w", err)
	}
	if _, err := s.Write(b); err != nil {
		return fmt.Errorf("rawpeer: write: %w", err)
	}
	return nil
}

// Receipt reads the next frame of the target's control stream, which
// must be a receipt.
func (p *Peer) Receipt(ctx context.Context) (*pb.Receipt, error) {
	type result struct {
		f   *pb.Frame
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var f pb.Frame
		_, err := transport.ReadFrame(p.control, 8<<20, &f)
		ch <- result{&f, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		if r.f.GetReceipt() == nil {
			return nil, fmt.Errorf("rawpeer: control frame %T is not a receipt", r.f.Kind)
		}
		return r.f.GetReceipt(), nil
	case <-ctx.Done():
		_ = p.Conn.CloseWithError(0, "") // ends the read
		<-ch
		return nil, ctx.Err()
	}
}

// Closed waits until the target closes the connection (or timeout) and
// returns the application error code it closed with.
func (p *Peer) Closed(timeout time.Duration) (code quic.ApplicationErrorCode, reason string, ok bool) {
	select {
	case <-p.Conn.Context().Done():
	case <-time.After(timeout):
		return 0, "", false
	}
	cause := context.Cause(p.Conn.Context())
	var ae *quic.ApplicationError
	if errors.As(cause, &ae) {
		return ae.ErrorCode, ae.ErrorMessage, true
	}
	return 0, cause.Error(), true
}

package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/ratelog"
)

// Refusals counts the connections this node refused, or that failed its
// checks, because of who was at the other end. They are logged at WARN, at
// most once a minute per remote address (or peer name) and kind, so that a
// stranger in a loop cannot flood the log.
type Refusals struct {
	// IdentityMismatch: a peer whose certificate names another node than
	// the one dialed (an impostor at a member's address, or a member that
	// moved without its certificate), or whose Hello claims a name its
	// certificate does not hold.
	IdentityMismatch uint64
	// UnknownCA: a certificate not signed by the cluster CA (another
	// cluster's node, or a stranger).
	UnknownCA uint64
	// NoCertificate: a client that presented none.
	NoCertificate uint64
	// BadCertificate: a certificate of the cluster CA that is not valid now
	// (expired, not yet valid, without client or server use), or that could
	// not be parsed.
	BadCertificate uint64
}

// Handshakes returns the refused handshakes (everything but
// IdentityMismatch, which happens also after one).
func (r Refusals) Handshakes() uint64 { return r.UnknownCA + r.NoCertificate + r.BadCertificate }

// refusals is the transport's counting and logging of Refusals.
type refusals struct {
	identity, unknownCA, noCert, badCert atomic.Uint64
	log                                  *ratelog.Limiter
}

func newRefusals() *refusals { return &refusals{log: ratelog.New(time.Minute)} }

func (r *refusals) snapshot() Refusals {
	return Refusals{IdentityMismatch: r.identity.Load(), UnknownCA: r.unknownCA.Load(),
		NoCertificate: r.noCert.Load(), BadCertificate: r.badCert.Load()}
}

// Refusals returns the counts since New.
func (t *Transport) Refusals() Refusals { return t.refused.snapshot() }

// refusal kinds, as logged.
const (
	kindIdentity = "identity mismatch"
	kindUnknown  = "unknown CA"
	kindNoCert   = "no certificate"
	kindBadCert  = "bad certificate"
)

// count counts one refusal of kind and logs it (rate-limited) with who:
// a remote address or a peer name.
func (t *Transport) countRefusal(kind, who string, err error) {
	switch kind {
	case kindIdentity:
		t.refused.identity.Add(1)
	case kindUnknown:
		t.refused.unknownCA.Add(1)
	case kindNoCert:
		t.refused.noCert.Add(1)
	default:
		t.refused.badCert.Add(1)
	}
	if ok, suppressed := t.refused.log.Allow(kind + " " + who); ok {
		t.log.Warn("connection refused: "+kind, "peer", who, "err", err, "suppressed", suppressed)
	}
}

// classify names the kind of a certificate verification error.
func classify(err error) string {
	var hostErr x509.HostnameError
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &hostErr):
		return kindIdentity
	case errors.As(err, &unknown):
		return kindUnknown
	case errors.As(err, &invalid):
		return kindBadCert
	}
	return ""
}

// serverTLSFor returns the TLS config of one incoming handshake: base,
// with the client's certificate verified here instead of inside crypto/tls,
// so that a refused one is counted and logged with the address it came
// from (crypto/tls would refuse it silently, before any callback).
func (t *Transport) serverTLSFor(base *tls.Config) func(*tls.ClientHelloInfo) (*tls.Config, error) {
	return func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		remote := "unknown"
		if chi.Conn != nil { // quic-go sets it with the remote address
			remote = hostOf(chi.Conn.RemoteAddr())
		}
		c := base.Clone()
		c.GetConfigForClient = nil
		c.VerifyConnection = func(cs tls.ConnectionState) error { return t.verifyClient(cs, remote) }
		return c, nil
	}
}

// verifyClient does what tls.RequireAndVerifyClientCert would: a
// certificate is required and must chain to the cluster CA for client
// use, now.
func (t *Transport) verifyClient(cs tls.ConnectionState, remote string) error {
	if len(cs.PeerCertificates) == 0 {
		err := errors.New("tls: the client presented no certificate")
		t.countRefusal(kindNoCert, remote, err)
		return err
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots:         t.cfg.Identity.Roots,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		kind := classify(err)
		if kind == "" {
			kind = kindBadCert
		}
		err = fmt.Errorf("tls: client certificate for %v refused: %w", cs.PeerCertificates[0].DNSNames, err)
		t.countRefusal(kind, remote, err)
		return err
	}
	return nil
}

// dialRefused counts and logs a dial to node that failed on the server's
// certificate.
func (t *Transport) dialRefused(node, addr string, err error) {
	if kind := classify(err); kind != "" {
		t.countRefusal(kind, node+" at "+addr, err)
	}
}

func hostOf(a net.Addr) string {
	if a == nil {
		return "unknown"
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

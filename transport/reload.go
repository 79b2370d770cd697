package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync/atomic"
)

// CertificateSource hands TLS the node's current certificate at every
// handshake (tls.Config.GetCertificate on the accepting side,
// GetClientCertificate on the dialing side), so that a renewed certificate
// is presented on new connections without a restart. Connections already
// open keep the certificate they were made with. Safe for concurrent use.
//
//	src := transport.NewCertificateSource(id)
//	serverTLS.GetCertificate, clientTLS.GetClientCertificate = src.GetCertificate, src.GetClientCertificate
//	...
//	next, err := transport.LoadIdentityFiles(ca, crt, key) // on SIGHUP
//	if err == nil { err = src.Reload(next) }                // refused: the old one stays
type CertificateSource struct {
	name  string
	roots *x509.CertPool
	cur   atomic.Pointer[tls.Certificate]
}

// ErrCertificateRefused is returned by Reload for a certificate that the
// running node cannot present: another name, or not from its CA.
var ErrCertificateRefused = errors.New("transport: certificate refused")

// NewCertificateSource starts with id's certificate. Reload accepts only
// certificates for the same name that chain to the same roots.
func NewCertificateSource(id Identity) *CertificateSource {
	s := &CertificateSource{name: id.Name, roots: id.Roots}
	c := id.Cert
	s.cur.Store(&c)
	return s
}

// Reload replaces the certificate presented from the next handshake on. It
// refuses, keeping the current one, a certificate for another name or one
// that does not chain to the roots the source was made with (a node cannot
// change its name or cluster while running).
func (s *CertificateSource) Reload(id Identity) error {
	if len(id.Cert.Certificate) == 0 {
		return fmt.Errorf("%w: no certificate", ErrCertificateRefused)
	}
	leaf := id.Cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(id.Cert.Certificate[0]); err != nil {
			return fmt.Errorf("%w: %w", ErrCertificateRefused, err)
		}
	}
	if id.Name != s.name || len(leaf.DNSNames) == 0 || leaf.DNSNames[0] != s.name {
		return fmt.Errorf("%w: it is for %q, the node is %q", ErrCertificateRefused, id.Name, s.name)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: s.roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("%w: not signed by this node's CA: %w", ErrCertificateRefused, err)
	}
	c := id.Cert
	c.Leaf = leaf
	s.cur.Store(&c)
	return nil
}

// Current returns the certificate presented now.
func (s *CertificateSource) Current() *tls.Certificate { return s.cur.Load() }

// GetCertificate is tls.Config.GetCertificate.
func (s *CertificateSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cur.Load(), nil
}

// GetClientCertificate is tls.Config.GetClientCertificate.
func (s *CertificateSource) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return s.cur.Load(), nil
}

package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/meshnode/meshnode/internal/admin"
)

// adminCert is the certificate the admin API serves HTTPS with, read from
// its files at start and again on SIGHUP (a renewed certificate).
type adminCert struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// adminTLS returns the admin API's TLS config, or nil for plain HTTP. Off
// loopback the API is always HTTPS, so its token never crosses the network
// in clear: with admin_tls_cert/admin_tls_key, or else the node's own
// certificate (its name is the node's, signed by the cluster CA; clients
// verify it with --admin-ca and --admin-name). On loopback it is HTTPS only
// when admin_tls_cert is set.
func adminTLS(cfg Config) (*adminCert, *tls.Config, error) {
	certFile, keyFile := cfg.AdminTLSCert, cfg.AdminTLSKey
	if certFile == "" {
		host, _, _ := net.SplitHostPort(cfg.AdminAddr)
		if admin.IsLoopback(host) {
			return nil, nil, nil
		}
		certFile, keyFile = cfg.certFiles()
	}
	ac := &adminCert{certFile: certFile, keyFile: keyFile}
	if err := ac.load(); err != nil {
		return nil, nil, err
	}
	return ac, &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return ac.cur.Load(), nil },
	}, nil
}

// load reads the files; on failure the certificate in use stays.
func (a *adminCert) load() error {
	c, err := tls.LoadX509KeyPair(a.certFile, a.keyFile)
	if err != nil {
		return fmt.Errorf("%w: admin API certificate %s / key %s: %w", errBadConfig, a.certFile, a.keyFile, err)
	}
	a.cur.Store(&c)
	return nil
}

package transport_test

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/transport"
)

// handshake runs a mutual TLS 1.3 handshake over a pipe, the server taking
// its certificate from src, and returns the serial the client saw.
func handshake(t *testing.T, src *transport.CertificateSource, client transport.Identity) string {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(a, &tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: src.GetCertificate,
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: client.Roots})
	cli := tls.Client(b, &tls.Config{MinVersion: tls.VersionTLS13, ServerName: "n1", RootCAs: client.Roots,
		Certificates: []tls.Certificate{client.Cert}})
	_ = a.SetDeadline(time.Now().Add(10 * time.Second))
	_ = b.SetDeadline(time.Now().Add(10 * time.Second))
	var wg sync.WaitGroup
	var serr error
	wg.Go(func() { serr = srv.Handshake() })
	if err := cli.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	wg.Wait()
	if serr != nil {
		t.Fatalf("server handshake: %v", serr)
	}
	return cli.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func TestCertificateSourceReload(t *testing.T) {
	ca, err := transport.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	first, err := ca.NewIdentity("n1")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.NewIdentity("n2")
	if err != nil {
		t.Fatal(err)
	}
	src := transport.NewCertificateSource(first)
	if got := handshake(t, src, client); got != first.Cert.Leaf.SerialNumber.String() {
		t.Fatalf("first handshake saw serial %s", got)
	}
	renewed, err := ca.NewIdentity("n1")
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(renewed); err != nil {
		t.Fatal(err)
	}
	if got := handshake(t, src, client); got != renewed.Cert.Leaf.SerialNumber.String() {
		t.Fatalf("after Reload the handshake saw serial %s, want the renewed %s", got, renewed.Cert.Leaf.SerialNumber)
	}

	other, err := transport.NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.NewIdentity("n1")
	if err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]transport.Identity{"another name": client, "another CA": foreign, "empty": {Name: "n1"}} {
		if err := src.Reload(id); !errors.Is(err, transport.ErrCertificateRefused) {
			t.Errorf("%s: Reload = %v, want ErrCertificateRefused", name, err)
		}
	}
	if src.Current().Leaf.SerialNumber.Cmp(renewed.Cert.Leaf.SerialNumber) != 0 {
		t.Error("a refused Reload replaced the certificate")
	}
}

package transport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strings"
	"time"
)

// CA is a cluster certificate authority: it issues the node certificates
// whose DNS SAN is the node name.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA creates a self-signed ECDSA P-256 CA valid for validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	if commonName == "" {
		return nil, errors.New("transport: new CA: common name is empty")
	}
	if validity <= 0 {
		return nil, fmt.Errorf("transport: new CA: validity %v must be positive", validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("transport: new CA: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("transport: new CA: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"meshnode"}},
		NotBefore:             now.Add(-time.Minute), // tolerate small clock skew
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("transport: new CA: create certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("transport: new CA: parse certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// LoadCA reads a CA from PEM (as written by CertPEM and KeyPEM).
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("transport: load CA: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("transport: load CA: certificate %q is not a CA", cert.Subject.CommonName)
	}
	key, err := parseECKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("transport: load CA: %w", err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("transport: load CA: key does not match the certificate")
	}
	return &CA{Cert: cert, Key: key}, nil
}

// CertPEM returns the CA certificate in PEM.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// KeyPEM returns the CA private key in PEM (PKCS #8). Keep it secret.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, fmt.Errorf("transport: CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Issue creates a node certificate: DNS SAN = nodeName, client and server
// authentication, a fresh ECDSA P-256 key.
func (ca *CA) Issue(nodeName string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if err := checkNodeName(nodeName); err != nil {
		return nil, nil, fmt.Errorf("transport: issue: %w", err)
	}
	if validity <= 0 {
		return nil, nil, fmt.Errorf("transport: issue: validity %v must be positive", validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: issue: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, fmt.Errorf("transport: issue: %w", err)
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter // a leaf cannot outlive its CA
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: nodeName, Organization: []string{"meshnode"}},
		DNSNames:     []string{nodeName},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: issue: create certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: issue: marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// NewIdentity issues a certificate for nodeName (valid one year) and loads it.
func (ca *CA) NewIdentity(nodeName string) (Identity, error) {
	certPEM, keyPEM, err := ca.Issue(nodeName, 365*24*time.Hour)
	if err != nil {
		return Identity{}, err
	}
	return NewIdentity(ca.CertPEM(), certPEM, keyPEM)
}

// Identity is what a node presents and trusts: the CA roots and its own
// certificate, whose DNS SAN is Name.
type Identity struct {
	Name  string
	Roots *x509.CertPool
	Cert  tls.Certificate
}

// NewIdentity loads an identity from PEM. It checks that the leaf chains to
// the CA and takes Name from the leaf's DNS SAN.
func NewIdentity(caPEM, certPEM, keyPEM []byte) (Identity, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return Identity{}, errors.New("transport: identity: no CA certificate found in the CA PEM")
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return Identity{}, fmt.Errorf("transport: identity: certificate and key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return Identity{}, fmt.Errorf("transport: identity: parse certificate: %w", err)
	}
	pair.Leaf = leaf
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return Identity{}, fmt.Errorf("transport: identity: certificate %q is not signed by this CA: %w", leaf.Subject.CommonName, err)
	}
	if len(leaf.DNSNames) == 0 {
		return Identity{}, fmt.Errorf("transport: identity: certificate %q has no DNS name (issue it with `meshnode cert issue`)", leaf.Subject.CommonName)
	}
	return Identity{Name: leaf.DNSNames[0], Roots: roots, Cert: pair}, nil
}

// LoadIdentityFiles is NewIdentity reading the three PEM files.
func LoadIdentityFiles(caFile, certFile, keyFile string) (Identity, error) {
	var data [3][]byte
	for i, f := range []string{caFile, certFile, keyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			return Identity{}, fmt.Errorf("transport: identity: %w", err)
		}
		data[i] = b
	}
	return NewIdentity(data[0], data[1], data[2])
}

func checkNodeName(name string) error {
	if name == "" {
		return errors.New("node name is empty")
	}
	if len(name) > 253 || strings.ContainsAny(name, " \t\r\n/\\,@*") {
		return fmt.Errorf("node name %q is not usable as a DNS name", name)
	}
	return nil
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

func parseCertPEM(b []byte) (*x509.Certificate, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, errors.New("no CERTIFICATE block in PEM")
		}
		if block.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parse certificate: %w", err)
			}
			return c, nil
		}
	}
}

func parseECKeyPEM(b []byte) (*ecdsa.PrivateKey, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, errors.New("no private key block in PEM")
		}
		switch block.Type {
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parse key: %w", err)
			}
			ek, ok := k.(*ecdsa.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("key is %T, want ECDSA", k)
			}
			return ek, nil
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parse key: %w", err)
			}
			return k, nil
		}
	}
}

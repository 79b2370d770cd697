package transport_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/transport"
)

func TestCARoundTripAndIdentity(t *testing.T) {
	ca := newCA(t)
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := transport.LoadCA(ca.CertPEM(), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, leafKey, err := ca2.Issue("n7", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string][]byte{"ca.pem": ca.CertPEM(), "n7.pem": certPEM, "n7.key": leafKey}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	id, err := transport.LoadIdentityFiles(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "n7.pem"), filepath.Join(dir, "n7.key"))
	if err != nil {
		t.Fatal(err)
	}
	if id.Name != "n7" || id.Cert.Leaf == nil || id.Roots == nil {
		t.Fatalf("identity %+v", id)
	}
}

func TestCertErrors(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	certPEM, keyPEM, err := ca.Issue("n1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := ca.Issue("n2", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caKey, _ := ca.KeyPEM()
	otherCAKey, _ := other.KeyPEM()
	cases := []struct {
		name string
		run  func() error
		want string
	}{
		{"identity from other CA", func() error { _, err := transport.NewIdentity(other.CertPEM(), certPEM, keyPEM); return err }, "not signed by this CA"},
		{"key of another cert", func() error { _, err := transport.NewIdentity(ca.CertPEM(), certPEM, otherKey); return err }, "certificate and key"},
		{"no CA PEM", func() error { _, err := transport.NewIdentity([]byte("junk"), certPEM, keyPEM); return err }, "no CA certificate"},
		{"CA key mismatch", func() error { _, err := transport.LoadCA(ca.CertPEM(), otherCAKey); return err }, "does not match"},
		{"leaf as CA", func() error { _, err := transport.LoadCA(certPEM, caKey); return err }, "not a CA"},
		{"garbage CA", func() error { _, err := transport.LoadCA([]byte("x"), []byte("y")); return err }, "no CERTIFICATE"},
		{"empty name", func() error { _, _, err := ca.Issue("", time.Hour); return err }, "empty"},
		{"bad name", func() error { _, _, err := ca.Issue("a b", time.Hour); return err }, "DNS name"},
		{"zero validity", func() error { _, err := transport.NewCA("x", 0); return err }, "positive"},
		{"missing file", func() error { _, err := transport.LoadIdentityFiles("/nonexistent", "", ""); return err }, "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestResetKeyPersisted(t *testing.T) {
	dir := t.TempDir()
	k1, err := transport.LoadResetKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := transport.LoadResetKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if *k1 != *k2 {
		t.Fatal("key changed across loads")
	}
	st, err := os.Stat(filepath.Join(dir, "quic-reset.key"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || st.Size() != 32 {
		t.Fatalf("key file mode %v size %d", st.Mode().Perm(), st.Size())
	}
	if err := os.WriteFile(filepath.Join(dir, "quic-reset.key"), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := transport.LoadResetKey(dir); err == nil || !strings.Contains(err.Error(), "delete the file") {
		t.Fatalf("short key: %v", err)
	}
	r1, _ := transport.LoadResetKey("")
	r2, _ := transport.LoadResetKey("")
	if *r1 == *r2 {
		t.Fatal("random keys equal")
	}
}

func TestConfigValidate(t *testing.T) {
	ca := newCA(t)
	good := testConfig(t, ca, "n1")
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	def := transport.DefaultConfig("n1")
	def.Identity, def.OutboxID = good.Identity, good.OutboxID
	if err := def.Validate(); err != nil {
		t.Fatalf("default config with identity: %v", err)
	}
	cases := []struct {
		name string
		edit func(*transport.Config)
		want string
	}{
		{"no name", func(c *transport.Config) { c.NodeName = "" }, "NodeName"},
		{"no cluster", func(c *transport.Config) { c.Cluster = "" }, "Cluster"},
		{"no boot id", func(c *transport.Config) { c.BootID = "" }, "BootID"},
		{"no outbox id", func(c *transport.Config) { c.OutboxID = [16]byte{} }, "OutboxID"},
		{"no identity", func(c *transport.Config) { c.Identity = transport.Identity{} }, "Identity"},
		{"name not in cert", func(c *transport.Config) { c.NodeName = "n2" }, "certificate is for"},
		{"tiny frames", func(c *transport.Config) { c.MaxFrameSize = 10 }, "MaxFrameSize"},
		{"no queue", func(c *transport.Config) { c.SendQueueSize = 0 }, "SendQueueSize"},
		{"no lanes", func(c *transport.Config) { c.Lanes = 0 }, "Lanes"},
		{"too many lanes", func(c *transport.Config) { c.Lanes = 1000 }, "Lanes"},
		{"tiny stream window", func(c *transport.Config) { c.StreamWindow = 1000 }, "StreamWindow"},
		{"huge stream window", func(c *transport.Config) { c.StreamWindow = 1 << 30 }, "StreamWindow"},
		{"zero timeout", func(c *transport.Config) { c.HandshakeTimeout = 0 }, "positive"},
		{"keepalive above idle", func(c *transport.Config) { c.KeepAlivePeriod = c.MaxIdleTimeout }, "KeepAlivePeriod"},
		{"bad addr", func(c *transport.Config) { c.ListenAddr = "nope" }, "ListenAddr"},
		{"bad port", func(c *transport.Config) { c.ListenAddr = "127.0.0.1:x" }, "port"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if _, err := transport.New(c, newResolver(), &recorder{}); err == nil {
				t.Fatal("New accepted a bad config")
			}
		})
	}
}

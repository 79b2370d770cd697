package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
)

// TestAdminOverTLS: a daemon serving its admin API over HTTPS with its own
// certificate is reachable by the CLI with --admin-ca and --admin-name,
// and a plain HTTP request with the token gets no answer from the API.
func TestAdminOverTLS(t *testing.T) {
	c := newCluster(t, "n1")
	d := c.nodes[0]
	f, err := os.OpenFile(d.config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "admin_token = \"s3cret\"\nadmin_tls_cert = %q\nadmin_tls_key = %q\n",
		filepath.Join(c.certs, "n1.crt"), filepath.Join(c.certs, "n1.key"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	d.logs = &syncBuffer{}
	cmd := exec.Command(meshnodeBin, "run", "--config", d.config)
	cmd.Stdout, cmd.Stderr = d.logs, d.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("the daemon's output:\n%s", d.logs.String())
		}
	})
	args := []string{"members", "--admin", "https://" + d.admin, "--token", "s3cret",
		"--admin-ca", filepath.Join(c.certs, "ca.crt"), "--admin-name", "n1"}
	testutil.WaitFor(t, 20*time.Second, "members over HTTPS", func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the daemon exited during start: %v", err)
		default:
		}
		out, _, err := cli(t, "", args...)
		return err == nil && strings.Contains(out, "n1")
	})
	if _, _, err := cli(t, "", "members", "--admin", d.admin, "--token", "s3cret"); err == nil {
		t.Fatal("the API answered plain HTTP")
	}
	if _, _, err := cli(t, "", append(args[:len(args)-2:len(args)-2], "--admin-name", "n2")...); err == nil {
		t.Fatal("the CLI accepted a certificate for another name")
	}
}

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/spf13/cobra"
)

// defaultHTTPTimeout bounds every request to the daemon, on top of the time
// a request asks the daemon to wait (ask --timeout, inbox pull --wait): an
// admin port that accepts and never answers must not hang a script.
const defaultHTTPTimeout = 30 * time.Second

// client is the admin API client with the CLI's error handling: each
// failure is one line with the exit code of its kind.
type client struct{ *admin.Client }

// addClientFlags adds --admin, --token, --http-timeout (env
// MESHNODE_ADMIN_ADDR, MESHNODE_ADMIN_TOKEN) and --json.
func addClientFlags(cmd *cobra.Command) {
	addr, token := "127.0.0.1:7948", ""
	if v, ok := os.LookupEnv("MESHNODE_ADMIN_ADDR"); ok {
		addr = v
	}
	if v, ok := os.LookupEnv("MESHNODE_ADMIN_TOKEN"); ok {
		token = v
	}
	cmd.Flags().String("admin", addr, "admin address of the daemon (env MESHNODE_ADMIN_ADDR)")
	cmd.Flags().String("token", token, "admin token, if the daemon has one (env MESHNODE_ADMIN_TOKEN)")
	cmd.Flags().Duration("http-timeout", defaultHTTPTimeout, "give up on a daemon that does not answer within this long")
	adminCA, adminName := os.Getenv("MESHNODE_ADMIN_CA"), os.Getenv("MESHNODE_ADMIN_NAME")
	cmd.Flags().String("admin-ca", adminCA, "CA certificate to verify an https:// --admin with, e.g. the cluster's ca.crt (env MESHNODE_ADMIN_CA; default: the system's)")
	cmd.Flags().String("admin-name", adminName, "name the daemon's certificate holds, when not the host of --admin: its node name (env MESHNODE_ADMIN_NAME)")
	addJSONFlag(cmd)
}

func newClient(cmd *cobra.Command) (*client, error) {
	addr, _ := cmd.Flags().GetString("admin")
	token, _ := cmd.Flags().GetString("token")
	timeout, _ := cmd.Flags().GetDuration("http-timeout")
	if timeout <= 0 {
		return nil, usagef("--http-timeout %v must be positive", timeout)
	}
	hc, err := adminHTTPClient(cmd)
	if err != nil {
		return nil, err
	}
	return &client{admin.NewClient(addr, token, timeout).WithHTTPClient(hc)}, nil
}

// adminHTTPClient verifies an HTTPS daemon with --admin-ca (the cluster CA
// for a daemon serving its node certificate) and --admin-name.
func adminHTTPClient(cmd *cobra.Command) (*http.Client, error) {
	caFile, _ := cmd.Flags().GetString("admin-ca")
	name, _ := cmd.Flags().GetString("admin-name")
	if caFile == "" && name == "" {
		return http.DefaultClient, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	if caFile != "" {
		pemBytes, err := os.ReadFile(caFile)
		if err != nil {
			return nil, usagef("--admin-ca: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pemBytes) {
			return nil, usagef("--admin-ca %s holds no PEM certificate", caFile)
		}
		tc.RootCAs = roots
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &http.Client{Transport: tr}, nil
}

// do is admin.Client.Do with the daemon's errors turned into exit codes
// and transport errors into one line saying the daemon is unreachable.
func (c *client) do(ctx context.Context, method, path string, body any, out any, wait time.Duration) error {
	err := c.Do(ctx, method, path, body, out, wait)
	var ae *admin.APIError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae) && ae.ErrorBody.Error != "":
		return withCode(codeOfAPI(ae.Code), errors.New(ae.ErrorBody.Error))
	case errors.As(err, &ae):
		return withCode(exitFailure, fmt.Errorf("the daemon at %s answered %d %s", c.Base(), ae.Status, http.StatusText(ae.Status)))
	case errors.Is(err, admin.ErrBadResponse):
		return fmt.Errorf("the daemon's answer is not the JSON expected: %w", err)
	}
	return c.unreachable(err, wait)
}

// unreachable says, in one line, that the daemon could not be reached and
// why, without Go's URL and dial prefixes.
func (c *client) unreachable(err error, wait time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return withCode(exitUnreachable, fmt.Errorf("the daemon at %s did not answer within %v (--http-timeout)", c.Base(), wait+c.Timeout()))
	}
	cause := err.Error()
	var errno syscall.Errno
	var opErr *net.OpError
	switch {
	case errors.As(err, &errno):
		cause = errno.Error()
	case errors.As(err, &opErr):
		cause = opErr.Err.Error()
	}
	return withCode(exitUnreachable, fmt.Errorf("cannot reach the daemon at %s: %s (is meshnode run running? set --admin)", c.Base(), cause))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// printJSON writes v as one line of JSON.
func printJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

package main

import (
	"bytes"
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
	"strings"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/spf13/cobra"
)

// defaultHTTPTimeout bounds every request to the daemon, on top of the time
// a request asks the daemon to wait (ask --timeout, inbox pull --wait): an
// admin port that accepts and never answers must not hang a script.
const defaultHTTPTimeout = 30 * time.Second

// client talks to a running daemon's admin API.
type client struct {
	base    string
	token   string
	timeout time.Duration // per request, beyond what the request asks the daemon to wait
	http    *http.Client
}

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
	base := addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	hc, err := adminHTTPClient(cmd)
	if err != nil {
		return nil, err
	}
	return &client{base: strings.TrimSuffix(base, "/"), token: token, timeout: timeout, http: hc}, nil
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

// do sends a request and decodes a JSON answer into out (a
// *json.RawMessage keeps it as it is). wait is how long the request asks
// the daemon to wait (a long poll, an ask's deadline); the request gives up
// after wait plus --http-timeout. An error answer becomes an error with the
// daemon's message and the exit code of its kind.
func (c *client) do(ctx context.Context, method, path string, body any, out any, wait time.Duration) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, wait+c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return usagef("admin address %q: %w", c.base, err)
	}
	if body != nil || method != http.MethodGet {
		// Also without a body: the daemon refuses a state change that
		// does not say JSON (a browser's cross-origin form could).
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return c.unreachable(err, wait)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return c.unreachable(err, wait)
	}
	if resp.StatusCode >= 300 {
		var e admin.ErrorBody
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return withCode(codeOfAPI(e.Code), errors.New(e.Error))
		}
		return withCode(exitFailure, fmt.Errorf("the daemon at %s answered %s", c.base, resp.Status))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("the daemon's answer is not the JSON expected: %w", err)
	}
	return nil
}

// unreachable says, in one line, that the daemon could not be reached and
// why, without Go's URL and dial prefixes.
func (c *client) unreachable(err error, wait time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return withCode(exitUnreachable, fmt.Errorf("the daemon at %s did not answer within %v (--http-timeout)", c.base, wait+c.timeout))
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
	return withCode(exitUnreachable, fmt.Errorf("cannot reach the daemon at %s: %s (is meshnode run running? set --admin)", c.base, cause))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// printJSON writes v as one line of JSON.
func printJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

package main

import (
	"context"
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
	addJSONFlag(cmd)
}

func newClient(cmd *cobra.Command) (*client, error) {
	addr, _ := cmd.Flags().GetString("admin")
	token, _ := cmd.Flags().GetString("token")
	timeout, _ := cmd.Flags().GetDuration("http-timeout")
	if timeout <= 0 {
		return nil, usagef("--http-timeout %v must be positive", timeout)
	}
	return &client{admin.NewClient(addr, token, timeout)}, nil
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

package main

import (
	"bytes"
	"encoding/json"

	"fmt"
	"io"
	"os"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/spf13/cobra"
)

// addBodyFlags adds the ways to give a message body.
func addBodyFlags(cmd *cobra.Command) {
	cmd.Flags().String("file", "", "read the body from this file ('-' for stdin)")
	cmd.Flags().Bool("raw", false, "send the body as raw bytes (google.protobuf.BytesValue) instead of JSON")
}

// readBody builds the request's body from the argument, --file or stdin.
func readBody(cmd *cobra.Command, args []string) (admin.SendRequest, error) {
	req := admin.SendRequest{To: args[0]}
	file, _ := cmd.Flags().GetString("file")
	raw, _ := cmd.Flags().GetBool("raw")
	var data []byte
	var err error
	switch {
	case len(args) > 1 && file != "":
		return req, usagef("give the body as an argument or with --file, not both")
	case len(args) > 1 && args[1] == "-", file == "-":
		data, err = io.ReadAll(cmd.InOrStdin())
	case len(args) > 1:
		data = []byte(args[1])
	case file != "":
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return req, fmt.Errorf("read body: %w", err)
	}
	switch {
	case raw:
		req.Raw = data
		if req.Raw == nil {
			req.Raw = []byte{}
		}
	case len(bytes.TrimSpace(data)) > 0:
		if !json.Valid(data) {
			return req, usagef("the body is not valid JSON (quote it in the shell, or use --raw for bytes)")
		}
		req.Body = data
	}
	return req, nil
}

func newTellCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tell ADDR [JSON|-]",
		Short: "Send a message at most once to actor@node",
		Example: `  meshnode tell orders@n2 '{"id": 42}'
  echo '{"id": 42}' | meshnode tell orders@n2 -
  meshnode tell orders@n2 --raw --file payload.bin`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := readBody(cmd, args)
			if err != nil {
				return err
			}
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var out json.RawMessage
			if err := c.do(cmd.Context(), "POST", "/v1/tell", req, &out, 0); err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "sent")
			return nil
		},
	}
	addBodyFlags(cmd)
	addClientFlags(cmd)
	return cmd
}

func newAskCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ask ADDR [JSON|-]",
		Short: "Send a request to actor@node and print its reply as JSON",
		Long: `Sends a request and waits for the reply, printed as JSON. The reply must be
a google.protobuf.Struct (inbox actors reply {"inbox": NAME, "cursor": N}).
With --json the reply is wrapped: {"reply": ...}.`,
		Example: `  meshnode ask orders@n2 '{"id": 42}'
  meshnode ask orders@n2 '{"id": 42}' --timeout 2s`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			timeout, _ := cmd.Flags().GetDuration("timeout")
			if timeout < 0 {
				return usagef("--timeout %v is negative", timeout)
			}
			req, err := readBody(cmd, args)
			if err != nil {
				return err
			}
			wait := 10 * time.Second // the daemon's default deadline
			if timeout > 0 {
				req.Timeout, wait = timeout.String(), timeout
			}
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var out struct {
				Reply json.RawMessage `json:"reply"`
			}
			if err := c.do(cmd.Context(), "POST", "/v1/ask", req, &out, wait); err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintln(cmd.OutOrStdout(), string(out.Reply))
			return nil
		},
	}
	cmd.Flags().Duration("timeout", 0, "how long to wait for the reply (default: the daemon's, 10s)")
	addBodyFlags(cmd)
	addClientFlags(cmd)
	return cmd
}

func newSendCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "send ADDR [JSON|-]",
		Short: "Send a message reliably to actor@node; prints Delivered or Queued",
		Long: `Sends a message at least once (exactly once in effect with --key). Prints
Delivered when the recipient processed it, or Queued when it is stored in the
daemon's outbox and will be delivered when the recipient can take it.`,
		Example: `  meshnode send orders@n2 '{"id": 42}' --key order-42
  meshnode send status@n2 '{"temp": 21.5}' --overwrite temp --ttl 1h
  meshnode send orders@n2 --file order.json --json`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ttl, _ := cmd.Flags().GetDuration("ttl")
			if ttl < 0 {
				return usagef("--ttl %v is negative: give how long the message may wait, e.g. --ttl 1h", ttl)
			}
			req, err := readBody(cmd, args)
			if err != nil {
				return err
			}
			req.Key, _ = cmd.Flags().GetString("key")
			req.Overwrite, _ = cmd.Flags().GetString("overwrite")
			if req.Key != "" && req.Overwrite != "" {
				return usagef("give --key or --overwrite, not both")
			}
			if ttl > 0 {
				req.TTL = ttl.String()
			}
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var out struct {
				Outcome string `json:"outcome"`
			}
			if err := c.do(cmd.Context(), "POST", "/v1/send", req, &out, 0); err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintln(cmd.OutOrStdout(), out.Outcome)
			return nil
		},
	}
	cmd.Flags().String("key", "", "idempotency key: the recipient processes it once")
	cmd.Flags().String("overwrite", "", "coalescing key: replaces a waiting message with the same key")
	cmd.Flags().Duration("ttl", 0, "expire the message after this long (it then goes to the dead-letter queue); 0 = never")
	addBodyFlags(cmd)
	addClientFlags(cmd)
	return cmd
}

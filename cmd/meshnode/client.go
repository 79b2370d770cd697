package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/spf13/cobra"
)

// client talks to a running daemon's admin API.
type client struct {
	base  string
	token string
	http  *http.Client
}

// addClientFlags adds --admin and --token (env MESHNODE_ADMIN_ADDR, MESHNODE_ADMIN_TOKEN).
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
}

func newClient(cmd *cobra.Command) *client {
	addr, _ := cmd.Flags().GetString("admin")
	token, _ := cmd.Flags().GetString("token")
	base := addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return &client{base: strings.TrimSuffix(base, "/"), token: token, http: &http.Client{}}
}

// do sends a request and decodes a JSON answer into out; an error answer
// becomes an error with the daemon's message.
func (c *client) do(method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return fmt.Errorf("admin address %s: %w", c.base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the daemon at %s (is `meshnode run` running? set --admin): %w", c.base, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		var e admin.ErrorBody
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return errors.New(e.Error)
		}
		return fmt.Errorf("daemon answered %s", resp.Status)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

func newMembersCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "members",
		Short:   "List the cluster members the daemon knows (name, state, address, age)",
		Example: "  meshnode members\n  meshnode members --admin 127.0.0.1:7958",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var out struct{ Members []admin.MemberJSON }
			if err := newClient(cmd).do("GET", "/v1/members", nil, &out); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tADDRESS\tAGE")
			for _, m := range out.Members {
				age := time.Duration(m.AgeSeconds * float64(time.Second)).Round(time.Second)
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Name, m.State, m.GossipAddr, age)
			}
			return tw.Flush()
		},
	}
	addClientFlags(cmd)
	return cmd
}

// bodyFlags are the ways to give a message body.
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
		return req, errors.New("give the body as an argument or with --file, not both")
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
			return req, errors.New("the body is not valid JSON (quote it in the shell, or use --raw for bytes)")
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
			if err := newClient(cmd).do("POST", "/v1/tell", req, nil); err != nil {
				return err
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
a google.protobuf.Struct (inbox actors reply {"inbox": NAME, "cursor": N}).`,
		Example: `  meshnode ask orders@n2 '{"id": 42}'
  meshnode ask orders@n2 '{"id": 42}' --timeout 2s`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := readBody(cmd, args)
			if err != nil {
				return err
			}
			if t, _ := cmd.Flags().GetDuration("timeout"); t > 0 {
				req.Timeout = t.String()
			}
			var out struct{ Reply json.RawMessage }
			if err := newClient(cmd).do("POST", "/v1/ask", req, &out); err != nil {
				return err
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
  meshnode send orders@n2 --file order.json`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := readBody(cmd, args)
			if err != nil {
				return err
			}
			req.Key, _ = cmd.Flags().GetString("key")
			req.Overwrite, _ = cmd.Flags().GetString("overwrite")
			if ttl, _ := cmd.Flags().GetDuration("ttl"); ttl > 0 {
				req.TTL = ttl.String()
			}
			var out struct{ Outcome string }
			if err := newClient(cmd).do("POST", "/v1/send", req, &out); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), out.Outcome)
			return nil
		},
	}
	cmd.Flags().String("key", "", "idempotency key: the recipient processes it once")
	cmd.Flags().String("overwrite", "", "coalescing key: replaces a waiting message with the same key")
	cmd.Flags().Duration("ttl", 0, "expire the message after this long (it then goes to the dead-letter queue)")
	addBodyFlags(cmd)
	addClientFlags(cmd)
	return cmd
}

func newOutboxCmd() *cobra.Command {
	ob := &cobra.Command{Use: "outbox", Short: "Inspect the daemon's outbox"}
	stats := &cobra.Command{
		Use:     "stats",
		Short:   "Print outbox statistics (depth, oldest age, AIMD limits, retries, DLQ)",
		Example: "  meshnode outbox stats\n  meshnode outbox stats --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var st admin.OutboxStatsJSON
			if err := newClient(cmd).do("GET", "/v1/outbox/stats", nil, &st); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if j, _ := cmd.Flags().GetBool("json"); j {
				return json.NewEncoder(w).Encode(st)
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "depth\t%d\noldest age\t%s\nin flight\t%d\n", st.Depth, time.Duration(st.OldestAgeSeconds*float64(time.Second)).Round(time.Millisecond), st.InFlight)
			fmt.Fprintf(tw, "enqueued\t%d\ndelivered\t%d\nretries\t%d\ndead-lettered\t%d\nexpired\t%d\ncoalesced\t%d\nDLQ depth\t%d\nfsyncs\t%d\n",
				st.Enqueued, st.Delivered, st.Retries, st.DeadLettered, st.Expired, st.Coalesced, st.DLQDepth, st.Fsyncs)
			for _, p := range slices.Sorted(maps.Keys(st.LimitByPeer)) {
				fmt.Fprintf(tw, "peer %s\tdepth %d, AIMD limit %d\n", p, st.DepthByPeer[p], st.LimitByPeer[p])
			}
			return tw.Flush()
		},
	}
	stats.Flags().Bool("json", false, "print JSON")
	addClientFlags(stats)
	ob.AddCommand(stats)
	return ob
}

func newDLQCmd() *cobra.Command {
	dlq := &cobra.Command{Use: "dlq", Short: "List, replay or purge the dead-letter queue"}

	list := &cobra.Command{
		Use:     "list",
		Short:   "List dead letters",
		Example: "  meshnode dlq list\n  meshnode dlq list --recipient orders@n2 --reason expired --limit 20",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			for _, f := range []string{"recipient", "reason"} {
				if v, _ := cmd.Flags().GetString(f); v != "" {
					q.Set(f, v)
				}
			}
			if l, _ := cmd.Flags().GetInt("limit"); l > 0 {
				q.Set("limit", strconv.Itoa(l))
			}
			var out struct {
				DeadLetters []admin.DeadLetterJSON `json:"dead_letters"`
			}
			if err := newClient(cmd).do("GET", "/v1/dlq?"+q.Encode(), nil, &out); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tRECIPIENT\tREASON\tAT\tATTEMPTS\tMSG")
			for _, d := range out.DeadLetters {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", d.ID, d.Recipient, d.Reason, d.At.Format(time.RFC3339), d.Attempts, d.MsgID)
			}
			return tw.Flush()
		},
	}
	list.Flags().String("recipient", "", "only dead letters for this actor@node")
	list.Flags().String("reason", "", "only reasons starting with this (e.g. expired, rejected, max attempts)")
	list.Flags().Int("limit", 0, "at most this many (default 100)")
	addClientFlags(list)

	replay := &cobra.Command{
		Use:     "replay",
		Short:   "Put dead letters back into the outbox (attempts reset)",
		Example: "  meshnode dlq replay --id 00000000000000a1\n  meshnode dlq replay --recipient orders@n2\n  meshnode dlq replay --all",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := dlqRequest(cmd)
			var out struct{ Replayed int }
			if err := newClient(cmd).do("POST", "/v1/dlq/replay", req, &out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "replayed %d\n", out.Replayed)
			return nil
		},
	}
	addDLQFilterFlags(replay)
	addClientFlags(replay)

	purge := &cobra.Command{
		Use:   "purge",
		Short: "Delete dead letters (asks for confirmation unless --yes)",
		Example: `  meshnode dlq purge --older-than 168h
  meshnode dlq purge --id 00000000000000a1 --yes
  meshnode dlq purge --all --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := dlqRequest(cmd)
			if yes, _ := cmd.Flags().GetBool("yes"); !yes {
				if !isTerminal(cmd.InOrStdin()) {
					return errors.New("dlq purge: stdin is not a terminal: pass --yes to purge without confirmation")
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Purge dead letters matching %s? [y/N] ", describeFilter(req))
				line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
					fmt.Fprintln(cmd.OutOrStdout(), "nothing purged")
					return nil
				}
			}
			var out struct{ Purged int }
			if err := newClient(cmd).do("POST", "/v1/dlq/purge", req, &out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "purged %d\n", out.Purged)
			return nil
		},
	}
	addDLQFilterFlags(purge)
	purge.Flags().Duration("older-than", 0, "only dead letters older than this")
	purge.Flags().BoolP("yes", "y", false, "do not ask for confirmation")
	addClientFlags(purge)

	dlq.AddCommand(list, replay, purge)
	return dlq
}

func addDLQFilterFlags(cmd *cobra.Command) {
	cmd.Flags().StringArray("id", nil, "dead letter id (repeatable)")
	cmd.Flags().String("recipient", "", "only dead letters for this actor@node")
	cmd.Flags().String("reason", "", "only reasons starting with this")
	cmd.Flags().Bool("all", false, "every dead letter (required when no other filter is given)")
}

func dlqRequest(cmd *cobra.Command) admin.DLQRequest {
	var r admin.DLQRequest
	r.IDs, _ = cmd.Flags().GetStringArray("id")
	r.Recipient, _ = cmd.Flags().GetString("recipient")
	r.Reason, _ = cmd.Flags().GetString("reason")
	r.All, _ = cmd.Flags().GetBool("all")
	if cmd.Flags().Lookup("older-than") != nil {
		if d, _ := cmd.Flags().GetDuration("older-than"); d > 0 {
			r.OlderThan = d.String()
		}
	}
	return r
}

func describeFilter(r admin.DLQRequest) string {
	var parts []string
	if len(r.IDs) > 0 {
		parts = append(parts, "ids "+strings.Join(r.IDs, ","))
	}
	if r.Recipient != "" {
		parts = append(parts, "recipient "+r.Recipient)
	}
	if r.Reason != "" {
		parts = append(parts, "reason "+r.Reason+"*")
	}
	if r.OlderThan != "" {
		parts = append(parts, "older than "+r.OlderThan)
	}
	if len(parts) == 0 {
		return "(all)"
	}
	return strings.Join(parts, ", ")
}

// isTerminal reports whether r is a character device (an interactive terminal).
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func newInboxCmd() *cobra.Command {
	ib := &cobra.Command{
		Use:   "inbox",
		Short: "Declare, pull and acknowledge inbox messages (what programs do over HTTP)",
	}
	declare := &cobra.Command{
		Use:     "declare NAME",
		Short:   "Declare an inbox: actor NAME@<this node> stores its messages for pulling",
		Example: "  meshnode inbox declare orders",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out struct{ Created bool }
			if err := newClient(cmd).do("POST", "/v1/inbox/"+url.PathEscape(args[0]), nil, &out); err != nil {
				return err
			}
			if out.Created {
				fmt.Fprintf(cmd.OutOrStdout(), "declared %s\n", args[0])
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "%s already declared\n", args[0])
			}
			return nil
		},
	}
	pull := &cobra.Command{
		Use:     "pull NAME",
		Short:   "Print messages after a cursor as JSON lines (long-polls with --wait)",
		Example: "  meshnode inbox pull orders --after 0 --max 10 --wait 30s",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			after, _ := cmd.Flags().GetUint64("after")
			maxN, _ := cmd.Flags().GetInt("max")
			wait, _ := cmd.Flags().GetDuration("wait")
			q := url.Values{"after": {strconv.FormatUint(after, 10)}, "max": {strconv.Itoa(maxN)}, "wait": {wait.String()}}
			var out struct {
				Messages []json.RawMessage `json:"messages"`
			}
			if err := newClient(cmd).do("GET", "/v1/inbox/"+url.PathEscape(args[0])+"/pull?"+q.Encode(), nil, &out); err != nil {
				return err
			}
			for _, m := range out.Messages {
				fmt.Fprintln(cmd.OutOrStdout(), string(m))
			}
			return nil
		},
	}
	pull.Flags().Uint64("after", 0, "cursor: return messages after it (your last acknowledged cursor)")
	pull.Flags().Int("max", 100, "most messages to return")
	pull.Flags().Duration("wait", 0, "long-poll this long when there are none")
	ack := &cobra.Command{
		Use:     "ack NAME CURSOR",
		Short:   "Acknowledge (delete) messages up to and including CURSOR",
		Example: "  meshnode inbox ack orders 17",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cur, err := strconv.ParseUint(args[1], 10, 64)
			if err != nil {
				return fmt.Errorf("cursor %q is not a non-negative integer", args[1])
			}
			var out struct{ Deleted int }
			if err := newClient(cmd).do("POST", "/v1/inbox/"+url.PathEscape(args[0])+"/ack", map[string]uint64{"up_to": cur}, &out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "acknowledged up to %d (%d deleted)\n", cur, out.Deleted)
			return nil
		},
	}
	for _, c := range []*cobra.Command{declare, pull, ack} {
		addClientFlags(c)
	}
	ib.AddCommand(declare, pull, ack)
	return ib
}

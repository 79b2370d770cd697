package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func newDLQCmd() *cobra.Command {
	dlq := &cobra.Command{Use: "dlq", Short: "List, show, replay or purge the dead-letter queue"}

	list := &cobra.Command{
		Use:     "list",
		Short:   "List dead letters",
		Example: "  meshnode dlq list\n  meshnode dlq list --recipient orders@n2 --reason expired --limit 20 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q := url.Values{}
			for _, f := range []string{"recipient", "reason"} {
				if v, _ := cmd.Flags().GetString(f); v != "" {
					q.Set(f, v)
				}
			}
			limit, _ := cmd.Flags().GetInt("limit")
			if limit < 0 {
				return usagef("--limit %d is negative", limit)
			}
			if limit > 0 {
				q.Set("limit", strconv.Itoa(limit))
			}
			dls, err := listDeadLetters(cmd, q)
			if err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), map[string]any{"dead_letters": dls})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tRECIPIENT\tREASON\tAT\tATTEMPTS\tMSG")
			for _, d := range dls {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", d.ID, d.Recipient, d.Reason, d.At.Format(time.RFC3339), d.Attempts, d.MsgID)
			}
			return tw.Flush()
		},
	}
	list.Flags().String("recipient", "", "only dead letters for this actor@node")
	list.Flags().String("reason", "", "only reasons starting with this (e.g. expired, rejected, max attempts)")
	list.Flags().Int("limit", 0, "at most this many (default 100)")
	addClientFlags(list)

	show := &cobra.Command{
		Use:     "show ID",
		Short:   "Show one dead letter with its body, headers and last error",
		Example: "  meshnode dlq show 00000000000000a1\n  meshnode dlq show 00000000000000a1 --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dls, err := listDeadLetters(cmd, url.Values{"id": {args[0]}})
			if err != nil {
				return err
			}
			if len(dls) == 0 {
				return withCode(exitNotFound, fmt.Errorf("no dead letter %q (meshnode dlq list shows the ids)", args[0]))
			}
			d := dls[0]
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), d)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "id\t%s\nrecipient\t%s\nreason\t%s\nat\t%s\nattempts\t%d\nmessage id\t%s\n",
				d.ID, d.Recipient, d.Reason, d.At.Format(time.RFC3339), d.Attempts, d.MsgID)
			if d.Key != "" {
				fmt.Fprintf(tw, "idempotency key\t%s\n", d.Key)
			}
			if d.LastError != "" {
				fmt.Fprintf(tw, "last error\t%s\n", d.LastError)
			}
			if d.Type != "" {
				fmt.Fprintf(tw, "body type\t%s\n", d.Type)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			switch {
			case len(d.Body) > 0:
				fmt.Fprintf(w, "body:\n%s\n", indentJSON(d.Body))
			case d.Raw != nil:
				fmt.Fprintf(w, "body (raw, base64):\n%s\n", base64.StdEncoding.EncodeToString(d.Raw))
			}
			return nil
		},
	}
	addClientFlags(show)

	replay := &cobra.Command{
		Use:     "replay",
		Short:   "Put dead letters back into the outbox (attempts reset)",
		Example: "  meshnode dlq replay --id 00000000000000a1\n  meshnode dlq replay --recipient orders@n2\n  meshnode dlq replay --all",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := dlqRequest(cmd)
			if err != nil {
				return err
			}
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var out struct {
				Replayed int `json:"replayed"`
			}
			if err := c.do(cmd.Context(), "POST", "/v1/dlq/replay", req, &out, 0); err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "replayed %d\n", out.Replayed)
			return nil
		},
	}
	addDLQFilterFlags(replay)
	addClientFlags(replay)

	purge := &cobra.Command{
		Use:   "purge",
		Short: "Delete dead letters (asks for confirmation on a terminal; --yes elsewhere)",
		Long: `Deletes the dead letters the filter selects. On a terminal it asks y/N
first. Without a terminal (cron, systemd, a pipe) it cannot ask, so it
refuses with exit code 2 unless --yes is given.`,
		Example: `  meshnode dlq purge --older-than 168h
  meshnode dlq purge --id 00000000000000a1 --yes
  meshnode dlq purge --all --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := dlqRequest(cmd)
			if err != nil {
				return err
			}
			if yes, _ := cmd.Flags().GetBool("yes"); !yes {
				question := fmt.Sprintf("Purge dead letters matching %s? [y/N] ", describeFilter(req))
				if err := confirm(cmd.InOrStdin(), isTerminal(cmd.InOrStdin()), cmd.ErrOrStderr(), question); err != nil {
					return err
				}
			}
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var out struct {
				Purged int `json:"purged"`
			}
			if err := c.do(cmd.Context(), "POST", "/v1/dlq/purge", req, &out, 0); err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "purged %d\n", out.Purged)
			return nil
		},
	}
	addDLQFilterFlags(purge)
	purge.Flags().Duration("older-than", 0, "only dead letters older than this")
	purge.Flags().BoolP("yes", "y", false, "do not ask for confirmation (needed without a terminal)")
	addClientFlags(purge)

	dlq.AddCommand(list, show, replay, purge)
	return dlq
}

func listDeadLetters(cmd *cobra.Command, q url.Values) ([]admin.DeadLetterJSON, error) {
	c, err := newClient(cmd)
	if err != nil {
		return nil, err
	}
	var out struct {
		DeadLetters []admin.DeadLetterJSON `json:"dead_letters"`
	}
	if err := c.do(cmd.Context(), "GET", "/v1/dlq?"+q.Encode(), nil, &out, 0); err != nil {
		return nil, err
	}
	return out.DeadLetters, nil
}

func indentJSON(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return string(raw)
	}
	return string(b)
}

// errNotConfirmed: the user answered something other than yes.
var errNotConfirmed = errors.New("not confirmed: nothing purged")

// confirm asks question on a terminal and reads the answer. Without a
// terminal, or when the answer cannot be read (end of input), it is a usage
// error (exit 2): a confirmation could not be had, and a script must say
// --yes. Any answer but y/yes is errNotConfirmed (exit 1).
func confirm(in io.Reader, terminal bool, out io.Writer, question string) error {
	if !terminal {
		return usagef("stdin is not a terminal, so there is no one to confirm: pass --yes to purge without confirmation")
	}
	fmt.Fprint(out, question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && (line == "" || !errors.Is(err, io.EOF)) {
		fmt.Fprintln(out)
		return usagef("no answer could be read (%v): nothing purged; pass --yes to purge without confirmation", err)
	}
	if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
		return withCode(exitFailure, errNotConfirmed)
	}
	return nil
}

// isTerminal reports whether r is an interactive terminal.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func addDLQFilterFlags(cmd *cobra.Command) {
	cmd.Flags().StringArray("id", nil, "dead letter id (repeatable)")
	cmd.Flags().String("recipient", "", "only dead letters for this actor@node")
	cmd.Flags().String("reason", "", "only reasons starting with this")
	cmd.Flags().Bool("all", false, "every dead letter (required when no other filter is given)")
}

func dlqRequest(cmd *cobra.Command) (admin.DLQRequest, error) {
	var r admin.DLQRequest
	r.IDs, _ = cmd.Flags().GetStringArray("id")
	r.Recipient, _ = cmd.Flags().GetString("recipient")
	r.Reason, _ = cmd.Flags().GetString("reason")
	r.All, _ = cmd.Flags().GetBool("all")
	if cmd.Flags().Lookup("older-than") != nil {
		d, _ := cmd.Flags().GetDuration("older-than")
		if d < 0 {
			return r, usagef("--older-than %v is negative", d)
		}
		if d > 0 {
			r.OlderThan = d.String()
		}
	}
	if !r.All && len(r.IDs) == 0 && r.Recipient == "" && r.Reason == "" && r.OlderThan == "" {
		return r, usagef("select dead letters with --id, --recipient, --reason or --older-than, or pass --all for every one")
	}
	return r, nil
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

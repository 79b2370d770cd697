package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newInboxCmd() *cobra.Command {
	ib := &cobra.Command{
		Use:   "inbox",
		Short: "List, declare, pull and acknowledge inbox messages (what programs do over HTTP)",
	}
	list := &cobra.Command{
		Use:     "list",
		Short:   "List the inboxes with their unacknowledged messages and last cursor",
		Example: "  meshnode inbox list\n  meshnode inbox list --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var out struct {
				Inboxes []struct {
					Name       string `json:"name"`
					Depth      int    `json:"depth"`
					LastCursor uint64 `json:"last_cursor"`
				} `json:"inboxes"`
				Failure string `json:"failure,omitempty"`
			}
			if err := c.do(cmd.Context(), "GET", "/v1/inbox", nil, &out, 0); err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tDEPTH\tLAST CURSOR")
			for _, in := range out.Inboxes {
				fmt.Fprintf(tw, "%s\t%d\t%d\n", in.Name, in.Depth, in.LastCursor)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if out.Failure != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "FAILED: the inbox store stopped (check the disk, then restart the daemon): %s\n", out.Failure)
			}
			return nil
		},
	}
	declare := &cobra.Command{
		Use:     "declare NAME",
		Short:   "Declare an inbox: actor NAME@<this node> stores its messages for pulling",
		Example: "  meshnode inbox declare orders",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var out struct {
				Inbox   string `json:"inbox"`
				Created bool   `json:"created"`
			}
			if err := c.do(cmd.Context(), "POST", "/v1/inbox/"+url.PathEscape(args[0]), nil, &out, 0); err != nil {
				return err
			}
			switch {
			case asJSON(cmd):
				return printJSON(cmd.OutOrStdout(), out)
			case out.Created:
				fmt.Fprintf(cmd.OutOrStdout(), "declared %s\n", args[0])
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "%s already declared\n", args[0])
			}
			return nil
		},
	}
	pull := &cobra.Command{
		Use:   "pull NAME",
		Short: "Print messages after a cursor as JSON lines (long-polls with --wait)",
		Long: `Prints each message after --after as one line of JSON. With --json it prints
one JSON object instead: {"messages": [...], "next_after": CURSOR}, where
next_after is the cursor to pass as --after next time (and to ack).`,
		Example: "  meshnode inbox pull orders --after 0 --max 10 --wait 30s\n  meshnode inbox pull orders --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			after, _ := cmd.Flags().GetUint64("after")
			maxN, _ := cmd.Flags().GetInt("max")
			wait, _ := cmd.Flags().GetDuration("wait")
			if maxN < 0 || wait < 0 {
				return usagef("--max and --wait must not be negative")
			}
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			q := url.Values{"after": {strconv.FormatUint(after, 10)}, "max": {strconv.Itoa(maxN)}, "wait": {wait.String()}}
			var out struct {
				Messages  []json.RawMessage `json:"messages"`
				NextAfter uint64            `json:"next_after"`
			}
			if err := c.do(cmd.Context(), "GET", "/v1/inbox/"+url.PathEscape(args[0])+"/pull?"+q.Encode(), nil, &out, wait); err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), out)
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
				return usagef("cursor %q is not a non-negative integer", args[1])
			}
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var out struct {
				Deleted int    `json:"deleted"`
				AckedTo uint64 `json:"acked_to"`
			}
			if err := c.do(cmd.Context(), "POST", "/v1/inbox/"+url.PathEscape(args[0])+"/ack", map[string]uint64{"up_to": cur}, &out, 0); err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "acknowledged up to %d (%d deleted)\n", cur, out.Deleted)
			return nil
		},
	}
	for _, c := range []*cobra.Command{list, declare, pull, ack} {
		addClientFlags(c)
	}
	ib.AddCommand(list, declare, pull, ack)
	return ib
}

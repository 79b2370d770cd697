package main

import (
	"fmt"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/spf13/cobra"
)

func newMembersCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "members",
		Short:   "List the cluster members the daemon knows (name, state, address, age)",
		Example: "  meshnode members\n  meshnode members --admin 127.0.0.1:7958\n  meshnode members --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var out struct {
				Members []admin.MemberJSON `json:"members"`
			}
			if err := c.do(cmd.Context(), "GET", "/v1/members", nil, &out, 0); err != nil {
				return err
			}
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), out)
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

func newOutboxCmd() *cobra.Command {
	ob := &cobra.Command{Use: "outbox", Short: "Inspect the daemon's outbox"}
	stats := &cobra.Command{
		Use:     "stats",
		Short:   "Print outbox statistics (depth, oldest age, AIMD limits, retries, DLQ)",
		Example: "  meshnode outbox stats\n  meshnode outbox stats --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := newClient(cmd)
			if err != nil {
				return err
			}
			var st admin.OutboxStatsJSON
			if err := c.do(cmd.Context(), "GET", "/v1/outbox/stats", nil, &st, 0); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if asJSON(cmd) {
				return printJSON(w, st)
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "depth\t%d\noldest age\t%s\nin flight\t%d\n", st.Depth, time.Duration(st.OldestAgeSeconds*float64(time.Second)).Round(time.Millisecond), st.InFlight)
			fmt.Fprintf(tw, "enqueued\t%d\ndelivered\t%d\nretries\t%d\ndead-lettered\t%d\nexpired\t%d\ncoalesced\t%d\nDLQ depth\t%d\ncommits (fsynced)\t%d\ncommit failures\t%d\nstream restores\t%d\nstreams forgotten\t%d\n",
				st.Enqueued, st.Delivered, st.Retries, st.DeadLettered, st.Expired, st.Coalesced, st.DLQDepth, st.Fsyncs, st.CommitFailures, st.StreamRestores, st.StreamsForgotten)
			if st.Failure != "" {
				fmt.Fprintf(tw, "FAILED\t%s\n", st.Failure)
			}
			for _, p := range slices.Sorted(maps.Keys(st.LimitByPeer)) {
				fmt.Fprintf(tw, "peer %s\tdepth %d, AIMD limit %d\n", p, st.DepthByPeer[p], st.LimitByPeer[p])
			}
			return tw.Flush()
		},
	}
	addClientFlags(stats)
	ob.AddCommand(stats)
	return ob
}

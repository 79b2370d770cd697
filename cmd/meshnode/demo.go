package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/meshnode/meshnode/internal/demo"
	"github.com/spf13/cobra"
)

func newDemoCmd() *cobra.Command {
	cfg := demo.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a local 3-node cluster and walk through tell, ask, tell-reliable, a partition and a thundering herd",
		Long: `demo starts three nodes in this process (certificates in a temporary
directory), then shows tell and ask, tell-reliable while one node is
partitioned off, the rejoin and the drain, and a thundering herd in which the
senders' AIMD limits back off. It prints each step, progress bars on the long
parts and a summary table, and leaves nothing running.`,
		Example: `  meshnode demo
  meshnode demo --offline 5000 --herd 20000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Ctrl-C ends the tour early and still stops every node.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return demo.Run(ctx, cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Offline, "offline", cfg.Offline, "reliable messages sent while a node is partitioned off")
	f.IntVar(&cfg.Herd, "herd", cfg.Herd, "messages each follower queues for the leader in the thundering herd")
	f.IntVar(&cfg.LeaderCap, "leader-mailbox", cfg.LeaderCap, "the leader's mailbox capacity")
	f.DurationVar(&cfg.Work, "work", cfg.Work, "the leader's time per message")
	f.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on each waiting step")
	return cmd
}

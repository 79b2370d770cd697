package main

import (
	"github.com/spf13/cobra"
)

// commands are the top-level command groups.
var commands = []func() *cobra.Command{
	newRunCmd,
	newMembersCmd,
	newTellCmd,
	newAskCmd,
	newSendCmd,
	newOutboxCmd,
	newDLQCmd,
	newInboxCmd,
	newCACmd,
	newCertCmd,
	newKeygenCmd,
	newDemoCmd,
	newTestnetCmd,
}

// newRootCmd builds the CLI: `meshnode <command>`.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "meshnode",
		Short: "A broker-free peer-to-peer mesh node: run it on every device, send to actor@node",
		Long: `meshnode runs one node per device. Nodes find each other by gossip, talk over
QUIC with mutual TLS, and keep reliable messages in a local outbox while a
peer is away. The same binary is the daemon (meshnode run) and the operator
CLI, which talks to a running daemon's admin API.`,
		Example: `  meshnode ca init --dir certs
  meshnode cert issue --name n1 --ca-dir certs
  meshnode run --name n1 --data-dir /var/lib/meshnode
  meshnode members
  meshnode send orders@n2 '{"id": 42}'`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, c := range commands {
		root.AddCommand(c())
	}
	return root
}

package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/meshnode/meshnode/internal/version"
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
	newKeyringCmd,
	newDoctorCmd,
	newVersionCmd,
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
CLI, which talks to a running daemon's admin API.

Exit codes: 0 success, 2 usage, 3 run could not start, 4 refused, 5 not
found, 6 the recipient failed; 10 unreachable, 11 full, 12 timeout are worth
retrying. See meshnode help exit-codes.`,
		Example: `  meshnode ca init --dir certs
  meshnode cert issue --name n1 --ca-dir certs
  meshnode run --name n1 --data-dir /var/lib/meshnode
  meshnode members
  meshnode send orders@n2 '{"id": 42}'`,
		Version:       version.Get().Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate(version.Get().String() + "\n")
	for _, c := range commands {
		root.AddCommand(c())
	}
	// A help topic: `meshnode help exit-codes` prints the table.
	root.AddCommand(&cobra.Command{Use: "exit-codes", Short: "The exit codes of every command, for scripts", Long: exitCodeTable()})
	strictArgs(root)
	return root
}

func newVersionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print the version, VCS revision and Go version of this binary",
		Example: "  meshnode version\n  meshnode version --json\n  meshnode --version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			if asJSON(cmd) {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(info)
			}
			fmt.Fprintln(cmd.OutOrStdout(), info)
			return nil
		},
	}
	addJSONFlag(cmd)
	return cmd
}

// addJSONFlag adds --json: print the answer as JSON instead of a table.
func addJSONFlag(cmd *cobra.Command) {
	cmd.Flags().Bool("json", false, "print JSON instead of text")
}

func asJSON(cmd *cobra.Command) bool {
	v, _ := cmd.Flags().GetBool("json")
	return v
}

// exitCodeTable renders exitCodes for the help topic.
func exitCodeTable() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "Every command exits with one of these codes; 10 and up are worth retrying.")
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "CODE\tNAME\tMEANING")
	for _, e := range exitCodes {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", e.code, e.name, e.what)
	}
	_ = tw.Flush()
	return b.String()
}

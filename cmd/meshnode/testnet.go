package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/meshnode/meshnode/testnet"
	"github.com/spf13/cobra"
)

func newTestnetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "testnet",
		Short: "Run the built-in scenarios on an in-process cluster under faults",
		Example: `  meshnode testnet list
  meshnode testnet run thundering-herd
  meshnode testnet run offline-delivery --size small --out docs`,
	}
	cmd.AddCommand(newTestnetListCmd(), newTestnetRunCmd())
	return cmd
}

func newTestnetListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Short:   "List the scenarios",
		Example: `  meshnode testnet list`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			desc := testnet.Scenarios()
			for _, name := range testnet.ScenarioNames() {
				fmt.Fprintf(cmd.OutOrStdout(), "%-22s %s\n", name, desc[name])
			}
			return nil
		},
	}
}

func newTestnetRunCmd() *cobra.Command {
	var (
		sizeName string
		size     testnet.Size
		out      string
		cpuprof  string
	)
	cmd := &cobra.Command{
		Use:   "run NAME|all",
		Short: "Run a scenario, print its summary and write its SVG report",
		Long: `run starts an in-process cluster, runs the scenario, checks its invariants
(nothing acknowledged lost, no keyed duplicates, order kept) and writes an SVG
report with AIMD limit per peer, outbox depth and delivery rate over time.`,
		Example: `  meshnode testnet run thundering-herd
  meshnode testnet run all --size small --out docs
  meshnode testnet run wave-deployment --workers 200 --messages 20000`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sizeName != "large" && sizeName != "small" {
				return fmt.Errorf("--size %q: want small or large", sizeName)
			}
			names := []string{args[0]}
			if args[0] == "all" {
				names = testnet.ScenarioNames()
			} else if _, ok := testnet.Scenarios()[args[0]]; !ok {
				return fmt.Errorf("unknown scenario %q (try: %s)", args[0], strings.Join(testnet.ScenarioNames(), ", "))
			}
			sizeOf := func(name string) testnet.Size {
				s := testnet.LargeSizeOf(name)
				if sizeName == "small" {
					s = testnet.SmallSizeOf(name)
				}
				if size.Nodes != 0 {
					s.Nodes = size.Nodes
				}
				if size.Workers != 0 {
					s.Workers = size.Workers
				}
				if size.Messages != 0 {
					s.Messages = size.Messages
				}
				return s
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if cpuprof != "" {
				stopProfile, err := startCPUProfile(cpuprof)
				if err != nil {
					return err
				}
				defer stopProfile()
			}
			w := cmd.OutOrStdout()
			var failed []string
			for _, name := range names {
				res, err := testnet.RunScenario(ctx, name, sizeOf(name), w)
				if err != nil {
					if len(names) == 1 || ctx.Err() != nil {
						return err // testnet's errors name the scenario
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "%v\n", err) // and the others still run
					failed = append(failed, name)
					continue
				}
				if out != "" {
					path, err := res.WriteSVG(out)
					if err != nil {
						return fmt.Errorf("scenario %s: write report: %w", name, err)
					}
					fmt.Fprintf(w, "report: %s\n", path)
				}
				if !res.OK() {
					failed = append(failed, name)
				}
			}
			if len(failed) > 0 {
				return fmt.Errorf("scenario checks failed: %s", strings.Join(failed, ", "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&sizeName, "size", "large", "small (seconds, as in the tests) or large (1,000 workers and 100k messages; the fleet: 200 nodes)")
	f.IntVar(&size.Nodes, "nodes", 0, "override the number of nodes")
	f.IntVar(&size.Workers, "workers", 0, "override the number of simulated workers")
	f.IntVar(&size.Messages, "messages", 0, "override the number of messages")
	f.StringVar(&out, "out", ".", "directory for the SVG report (\"\" to skip)")
	f.StringVar(&cpuprof, "cpuprofile", "", "write a CPU profile of the whole run to this file (read it with go tool pprof)")
	return cmd
}

// startCPUProfile profiles the process into path until the returned
// function runs.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile %s: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

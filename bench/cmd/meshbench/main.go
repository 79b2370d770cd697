// Command meshbench measures meshnode side by side with NATS, JetStream,
// raw quic-go and bbolt in one process and one run, and prints a table:
// phase | meshnode | comparison | ratio | target | met?
//
//	cd bench && go run ./cmd/meshbench                    # make bench size (100k backlog)
//	cd bench && go run ./cmd/meshbench -backlog 1000000   # the full figure
//	cd bench && go run ./cmd/meshbench -only tell,ask -json out.json
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/meshnode/meshnode/bench/internal/harness"
)

func main() {
	harness.MaybeChild() // the rss phase re-executes this binary
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "meshbench:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := harness.DefaultConfig()
	var only, senders, jsonPath, cpuProfile string
	flag.IntVar(&cfg.Payload, "payload", cfg.Payload, "payload bytes per message")
	flag.IntVar(&cfg.N, "n", cfg.N, "messages per throughput measurement (upper bound; -duration may end it first)")
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "time per throughput measurement (upper bound; -n may end it first)")
	flag.IntVar(&cfg.Asks, "asks", cfg.Asks, "sequential round trips per latency measurement")
	flag.IntVar(&cfg.Askers, "askers", cfg.Askers, "concurrent askers of the ask throughput measurement")
	flag.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "interleaved rounds of the tell and ask comparisons (their rows report the medians)")
	flag.StringVar(&senders, "senders", "1,8,64", "concurrent senders of the reliable phase, comma-separated")
	flag.IntVar(&cfg.Backlog, "backlog", cfg.Backlog, "messages queued for the drain and rss phases")
	flag.IntVar(&cfg.Actors, "actors", cfg.Actors, "idle actors spawned by the actors phase")
	flag.StringVar(&only, "only", "", "run only these phases, comma-separated: "+strings.Join(harness.Phases, ","))
	flag.StringVar(&jsonPath, "json", "", "also write the table as JSON to this file")
	flag.StringVar(&cfg.WorkDir, "workdir", cfg.WorkDir, "parent of the temporary data directories (use a real disk: fsync matters)")
	flag.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "deadline for one phase to reach its end state")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.IntVar(&cfg.AIMDMax, "aimd-max", 0, "the relay's AIMD maximum per peer (0: the node's default)")
	flag.IntVar(&cfg.RelayBatch, "relay-batch", 0, "the relay's messages per emission (0: the node's default)")
	flag.StringVar(&cfg.Profiles, "profiles", "", "write CPU profiles of the meshnode parts of tell, ask (its concurrent askers) and drain (tell.pprof, ask.pprof, drain.pprof) to this directory")
	curves := flag.String("curves", "", "with -only curves: write tell.svg and drain.svg to this directory")
	quiet := flag.Bool("q", false, "no progress lines on stderr")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (see -h)", flag.Args())
	}
	if !*quiet {
		cfg.Progress = os.Stderr
	}
	if only != "" {
		cfg.Only = strings.Split(only, ",")
	}
	cfg.Senders = nil
	for _, s := range strings.Split(senders, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("-senders: %q is not a number", s)
		}
		cfg.Senders = append(cfg.Senders, v)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cpuProfile != "" && cfg.Profiles != "" {
		return fmt.Errorf("-cpuprofile and -profiles both profile the CPU: choose one")
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := harness.Run(cfg)
	if rep != nil {
		m := rep.Machine
		fmt.Printf("meshbench %s\nmachine: %d CPUs, %s, %s %s; took %s\n\n", rep.Config, m.CPUs, m.CPUModel, m.GoVersion, m.OS, rep.Duration)
		if werr := rep.WriteTable(os.Stdout); werr != nil && err == nil {
			err = werr
		}
		if jsonPath != "" {
			if werr := rep.WriteJSON(jsonPath); werr != nil && err == nil {
				err = werr
			}
		}
		if *curves != "" {
			if werr := rep.WriteCurves(*curves); werr != nil && err == nil {
				err = werr
			}
		}
	}
	return err
}

package harness

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Phase names, in the order Run executes them.
const (
	PhaseTell     = "tell"     // meshnode Tell vs NATS pub→sub vs raw quic-go stream
	PhaseAsk      = "ask"      // meshnode Ask vs NATS request-reply vs raw quic-go echo
	PhaseReliable = "reliable" // TellReliable to an offline peer vs JetStream vs bbolt Batch
	PhaseDrain    = "drain"    // drain of a backlog to a returning peer
	PhaseRSS      = "rss"      // RSS of a child process with the backlog queued
	PhaseActors   = "actors"   // heap per idle actor
	PhaseCurves   = "curves"   // Tell and drain at each senders level and payload size; only when named in Only
)

// Phases lists every phase in execution order.
var Phases = []string{PhaseTell, PhaseAsk, PhaseReliable, PhaseDrain, PhaseRSS, PhaseActors, PhaseCurves}

// Config sizes a run. Start from DefaultConfig.
type Config struct {
	Payload    int           // payload bytes of every message
	N          int           // messages per throughput measurement (upper bound; Duration may end it first)
	Duration   time.Duration // time per throughput measurement (upper bound; N may end it first)
	Asks       int           // sequential round trips per latency measurement
	Askers     int           // concurrent askers of the ask throughput measurement
	Rounds     int           // interleaved rounds of the tell and ask comparisons; their rows report medians
	Senders    []int         // concurrent senders of the durable-enqueue phase and of the curves' tells
	Backlog    int           // messages queued for the drain and RSS phases
	Actors     int           // idle actors spawned by the actors phase
	Only       []string      // phases to run; empty = all
	WorkDir    string        // parent of the temporary data directories
	Timeout    time.Duration // deadline of one phase's end state (all received / drained)
	Progress   io.Writer     // progress lines while running; nil = none
	Profiles   string        // directory for CPU profiles of the meshnode parts of tell, ask and drain; "" = none
	AIMDMax    int           // the relay's AIMD maximum per peer (partition Limiter.Max); 0 = the node's default
	RelayBatch int           // the relay's messages per emission (partition BatchSize); 0 = the node's default
}

// DefaultConfig returns the `make bench` size: finishes in a few minutes on
// two cores.
func DefaultConfig() Config {
	return Config{
		Payload:  128,             // the size every comparison uses
		N:        1_000_000,       // high enough that Duration ends the fast phases
		Duration: 2 * time.Second, // per measurement; long enough for a steady rate
		Asks:     5000,            // round trips for p50/p99
		Askers:   64,              // many callers sharing one connection and one replier
		Rounds:   3,               // a median of three interleaved rounds outlasts a slow moment of the host
		Senders:  []int{1, 8, 64}, // one, a few, and many concurrent senders
		Backlog:  100_000,         // make bench size; 1_000_000 for the full figure
		Actors:   100_000,         // the idle-actor memory figure is per actor of 100k
		Only:     nil,             // all phases
		WorkDir:  os.TempDir(),    // on the machine's disk, so fsync is real
		Timeout:  5 * time.Minute, // a stuck phase fails instead of hanging
		Progress: nil,             // quiet
	}
}

// Validate reports the first problem with c, wrapped in ErrBadConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Payload < 1 || c.Payload > 1<<20:
		return bad("payload %d must be in [1, 1 MiB]", c.Payload)
	case c.N < 1:
		return bad("n %d must be positive", c.N)
	case c.Duration <= 0:
		return bad("duration %v must be positive", c.Duration)
	case c.Asks < 1:
		return bad("asks %d must be positive", c.Asks)
	case c.Askers < 1 || c.Askers > 4096:
		return bad("askers %d must be in [1, 4096]", c.Askers)
	case c.Rounds < 1 || c.Rounds > 100:
		return bad("rounds %d must be in [1, 100]", c.Rounds)
	case len(c.Senders) == 0:
		return bad("senders: need at least one level")
	case c.Backlog < 1:
		return bad("backlog %d must be positive", c.Backlog)
	case c.Actors < 1:
		return bad("actors %d must be positive", c.Actors)
	case c.WorkDir == "":
		return bad("work directory is empty")
	case c.Timeout <= 0:
		return bad("timeout %v must be positive", c.Timeout)
	}
	for _, s := range c.Senders {
		if s < 1 || s > 4096 {
			return bad("senders level %d must be in [1, 4096]", s)
		}
	}
	for _, p := range c.Only {
		if !known(p) {
			return bad("unknown phase %q (phases: %s)", p, strings.Join(Phases, ","))
		}
	}
	return nil
}

func known(p string) bool {
	for _, q := range Phases {
		if p == q {
			return true
		}
	}
	return false
}

// runs reports whether phase p is selected. The curves phase takes
// minutes and runs only when named.
func (c Config) runs(p string) bool {
	if len(c.Only) == 0 {
		return p != PhaseCurves
	}
	for _, q := range c.Only {
		if q == p {
			return true
		}
	}
	return false
}

func (c Config) logf(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, format+"\n", args...)
	}
}

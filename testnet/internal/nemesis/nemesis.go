// Package nemesis plans random fault schedules: the same random seed, node
// count, duration and kinds always give the same schedule. Applying it is
// the cluster's business (testnet.Cluster.RunNemesis).
package nemesis

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind int

const (
	Partition Kind = iota + 1 // split the nodes into two random groups
	Isolate                   // cut one node from all
	Kill                      // crash a running node (no leave)
	Restart                   // bring a killed node back (same name and data)
	Heal                      // remove every network fault
	Advance                   // every node's clocks jump forward by Duration (time passes at once)
	StepClock                 // one node's wall clock steps by Duration (either sign); it shows at its next restart
	DiskFull                  // one node's disk refuses writes (its outbox's commits fail) until the next heal
	SyncFail                  // one node's disk fails the sync of its next outbox commit: its outbox stops until a Restart of it (planned like Kill)
)

func (k Kind) String() string {
	switch k {
	case Partition:
		return "partition"
	case Isolate:
		return "isolate"
	case Kill:
		return "kill"
	case Restart:
		return "restart"
	case Heal:
		return "heal"
	case Advance:
		return "advance"
	case StepClock:
		return "step-clock"
	case DiskFull:
		return "disk-full"
	case SyncFail:
		return "sync-fail"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Step is one fault at an offset from the start.
type Step struct {
	At       time.Duration
	Kind     Kind
	Node     int           // Isolate, Kill, Restart, StepClock, DiskFull, SyncFail
	Groups   [][]int       // Partition
	Duration time.Duration // Advance, StepClock
}

func (s Step) String() string {
	switch s.Kind {
	case Partition:
		return fmt.Sprintf("%v %s %v", s.At, s.Kind, s.Groups)
	case Heal:
		return fmt.Sprintf("%v %s", s.At, s.Kind)
	case Advance:
		return fmt.Sprintf("%v %s %v", s.At, s.Kind, s.Duration)
	case StepClock:
		return fmt.Sprintf("%v %s %d %v", s.At, s.Kind, s.Node, s.Duration)
	}
	return fmt.Sprintf("%v %s %d", s.At, s.Kind, s.Node)
}

// Config describes a schedule.
type Config struct {
	Seed     uint64          // same seed, same schedule
	Nodes    int             // cluster size (>= 2)
	Duration time.Duration   // faults happen in [0, Duration); a final heal (network and disks) and restarts follow at Duration
	MinGap   time.Duration   // shortest time between steps
	MaxGap   time.Duration   // longest time between steps
	Kinds    []Kind          // kinds to draw from; Heal is always added
	MaxDown  int             // most nodes killed at once (0 = (Nodes-1)/2)
	Protect  []int           // nodes never killed or isolated (e.g. the node the others join through)
	Advances []time.Duration // Advance draws its jump from these (required with Advance)
	Steps    []time.Duration // StepClock draws its step from these (required with StepClock)
}

// ErrBadConfig is returned by Plan for an unusable Config.
var ErrBadConfig = errors.New("nemesis: bad config")

// Validate reports a Config that cannot be planned.
func (c Config) Validate() error {
	switch {
	case c.Nodes < 2:
		return fmt.Errorf("%w: need at least 2 nodes, have %d", ErrBadConfig, c.Nodes)
	case c.Duration <= 0:
		return fmt.Errorf("%w: duration must be positive", ErrBadConfig)
	case c.MinGap <= 0 || c.MaxGap < c.MinGap:
		return fmt.Errorf("%w: gaps must satisfy 0 < MinGap <= MaxGap", ErrBadConfig)
	case len(c.Kinds) == 0:
		return fmt.Errorf("%w: no fault kinds", ErrBadConfig)
	}
	for _, k := range c.Kinds {
		if k == Advance && len(c.Advances) == 0 || k == StepClock && len(c.Steps) == 0 {
			return fmt.Errorf("%w: %s needs durations to draw from", ErrBadConfig, k)
		}
	}
	for _, p := range c.Protect {
		if p < 0 || p >= c.Nodes {
			return fmt.Errorf("%w: protected node %d out of range", ErrBadConfig, p)
		}
	}
	return nil
}

// Plan returns the schedule for c. Every kill is followed by a restart of
// the same node before the end, and the schedule ends healed with every
// node running, so a checker can wait for the drain.
func Plan(c Config) ([]Step, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	maxDown := c.MaxDown
	if maxDown <= 0 {
		maxDown = max(1, (c.Nodes-1)/2)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6e656d65736973))
	kinds := append(slices.Clone(c.Kinds), Heal)
	down := map[int]bool{}
	var steps []Step
	at := time.Duration(0)
	for {
		at += c.MinGap + time.Duration(rng.Int64N(int64(c.MaxGap-c.MinGap)+1))
		if at >= c.Duration {
			break
		}
		kind := kinds[rng.IntN(len(kinds))]
		step := Step{At: at, Kind: kind}
		switch kind {
		case Partition:
			perm := rng.Perm(c.Nodes)
			cut := 1 + rng.IntN(c.Nodes-1)
			a, b := slices.Clone(perm[:cut]), slices.Clone(perm[cut:])
			slices.Sort(a)
			slices.Sort(b)
			step.Groups = [][]int{a, b}
		case Isolate, Kill, SyncFail:
			cands := candidates(c, down, false)
			if len(cands) == 0 || (kind != Isolate && len(down) >= maxDown) {
				continue
			}
			step.Node = cands[rng.IntN(len(cands))]
			if kind != Isolate {
				down[step.Node] = true // a stopped outbox waits for a Restart too
			}
		case Restart:
			cands := candidates(c, down, true)
			if len(cands) == 0 {
				continue
			}
			step.Node = cands[rng.IntN(len(cands))]
			delete(down, step.Node)
		case Advance:
			step.Duration = c.Advances[rng.IntN(len(c.Advances))]
		case StepClock:
			step.Node = rng.IntN(c.Nodes)
			step.Duration = c.Steps[rng.IntN(len(c.Steps))]
		case DiskFull:
			step.Node = rng.IntN(c.Nodes)
		}
		steps = append(steps, step)
	}
	steps = append(steps, Step{At: c.Duration, Kind: Heal})
	rest := make([]int, 0, len(down))
	for i := range down {
		rest = append(rest, i)
	}
	slices.Sort(rest)
	for _, i := range rest {
		steps = append(steps, Step{At: c.Duration, Kind: Restart, Node: i})
	}
	return steps, nil
}

// candidates lists nodes that may be killed/isolated (wantDown false) or
// restarted (wantDown true), in order.
func candidates(c Config, down map[int]bool, wantDown bool) []int {
	var out []int
	for i := range c.Nodes {
		if down[i] != wantDown || (!wantDown && slices.Contains(c.Protect, i)) {
			continue
		}
		out = append(out, i)
	}
	return out
}

// Format prints a schedule one step per line.
func Format(steps []Step) string {
	var b strings.Builder
	for _, s := range steps {
		b.WriteString(s.String())
		b.WriteByte('\n')
	}
	return b.String()
}

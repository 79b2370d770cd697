package testnet

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/meshnode/meshnode/testnet/internal/nemesis"
)

// NemesisConfig describes a seeded random fault schedule.
type NemesisConfig = nemesis.Config

// FaultStep is one step of a schedule.
type FaultStep = nemesis.Step

// FaultKind is a kind of fault a nemesis draws from.
type FaultKind = nemesis.Kind

// Fault kinds.
const (
	FaultPartition = nemesis.Partition
	FaultIsolate   = nemesis.Isolate
	FaultKill      = nemesis.Kill
	FaultRestart   = nemesis.Restart
	FaultHeal      = nemesis.Heal
	FaultAdvance   = nemesis.Advance
	FaultStepClock = nemesis.StepClock
	FaultDiskFull  = nemesis.DiskFull
	FaultSyncFail  = nemesis.SyncFail
)

// PlanFaults returns the schedule for cfg: the same config (seed
// included) always gives the same schedule.
func PlanFaults(cfg NemesisConfig) ([]FaultStep, error) { return nemesis.Plan(cfg) }

// FormatFaults prints a schedule, one step per line.
func FormatFaults(steps []FaultStep) string { return nemesis.Format(steps) }

// RunNemesis applies steps at their offsets from now, logging each to log
// (may be nil). It returns when the last step is applied or ctx ends.
// A restart joins the running nodes; Partition replaces earlier network
// faults (the schedule's partitions are meant one at a time); Heal also
// frees the disks DiskFull filled.
func (c *Cluster) RunNemesis(ctx context.Context, steps []FaultStep, log io.Writer) error {
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for _, s := range steps {
		if d := time.Until(start.Add(s.At)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return fmt.Errorf("testnet: nemesis: %w", ctx.Err())
			case <-timer.C:
			}
		}
		if log != nil {
			fmt.Fprintf(log, "nemesis %6.2fs %s\n", time.Since(start).Seconds(), s)
		}
		if err := c.apply(s); err != nil {
			return fmt.Errorf("testnet: nemesis step %q: %w", s.String(), err)
		}
	}
	return nil
}

func (c *Cluster) apply(s FaultStep) error {
	switch s.Kind {
	case FaultPartition:
		c.Heal()
		c.Partition(s.Groups...)
	case FaultIsolate:
		c.Isolate(s.Node)
	case FaultKill:
		return c.Kill(s.Node)
	case FaultRestart:
		if c.Node(s.Node) != nil {
			// Running after SyncFail: its outbox stopped until a restart.
			if err := c.Kill(s.Node); err != nil {
				return err
			}
		}
		return c.Restart(s.Node)
	case FaultHeal:
		c.Heal()
		c.FreeDisks()
	case FaultAdvance:
		c.Advance(s.Duration)
	case FaultStepClock:
		c.Clock(s.Node).Step(s.Duration)
	case FaultDiskFull:
		c.DiskFull(s.Node)
	case FaultSyncFail:
		c.SyncFail(s.Node)
	default:
		return fmt.Errorf("unknown fault kind %v", s.Kind)
	}
	return nil
}

package harness

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// Run executes the selected phases in order, in this process (the rss phase
// in a child), and returns the table. A failing phase stops the run with an
// error naming it; rows of the phases before it are returned too.
func Run(cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("bench: create work directory: %w", err)
	}
	dir, err := os.MkdirTemp(cfg.WorkDir, "meshbench-")
	if err != nil {
		return nil, fmt.Errorf("bench: create run directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	e, err := newEnv(cfg, dir)
	if err != nil {
		return nil, err
	}
	rep := &Report{Started: time.Now(), Machine: DescribeMachine(), Config: cfg.Flags()}
	phases := []struct {
		name string
		run  func() ([]Row, error)
	}{
		{PhaseTell, e.tellPhase},
		{PhaseAsk, e.askPhase},
		{PhaseReliable, e.reliablePhase},
		{PhaseDrain, e.drainPhase},
		{PhaseRSS, e.rssPhase},
		{PhaseActors, e.actorsPhase},
		{PhaseCurves, e.curvesPhase},
	}
	for _, p := range phases {
		if !cfg.runs(p.name) {
			continue
		}
		cfg.logf("== %s", p.name)
		rows, err := p.run()
		if err != nil {
			rep.Duration = time.Since(rep.Started).Round(time.Millisecond).String()
			return rep, fmt.Errorf("bench: phase %s: %w", p.name, err)
		}
		rep.Rows = append(rep.Rows, rows...)
	}
	rep.Curves = e.points
	rep.Duration = time.Since(rep.Started).Round(time.Millisecond).String()
	return rep, nil
}

// Flags returns the meshbench flags that reproduce cfg.
func (c Config) Flags() string {
	senders := make([]string, len(c.Senders))
	for i, s := range c.Senders {
		senders[i] = fmt.Sprint(s)
	}
	f := fmt.Sprintf("-payload %d -n %d -duration %v -asks %d -askers %d -rounds %d -senders %s -backlog %d -actors %d",
		c.Payload, c.N, c.Duration, c.Asks, c.Askers, c.Rounds, strings.Join(senders, ","), c.Backlog, c.Actors)
	if c.AIMDMax > 0 {
		f += fmt.Sprintf(" -aimd-max %d", c.AIMDMax)
	}
	if c.RelayBatch > 0 {
		f += fmt.Sprintf(" -relay-batch %d", c.RelayBatch)
	}
	if len(c.Only) > 0 {
		f += " -only " + strings.Join(c.Only, ",")
	}
	return f
}

// DescribeMachine reads the CPU count and model.
func DescribeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

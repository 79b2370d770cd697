package testnet

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// chaosKnobs: TESTNET_CHAOS_SEEDS (comma list, default 1,2,3) and
// TESTNET_CHAOS_DURATION (default 4s) make the chaos test longer.
func chaosKnobs(t *testing.T) ([]uint64, time.Duration) {
	seeds := []uint64{1, 2, 3}
	if s := os.Getenv("TESTNET_CHAOS_SEEDS"); s != "" {
		seeds = nil
		for _, f := range strings.Split(s, ",") {
			v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				t.Fatalf("TESTNET_CHAOS_SEEDS: %v", err)
			}
			seeds = append(seeds, v)
		}
	}
	d := 4 * time.Second
	if s := os.Getenv("TESTNET_CHAOS_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("TESTNET_CHAOS_DURATION: %v", err)
		}
	}
	return seeds, d
}

// TestChaos runs reliable traffic between every pair of a 5-node cluster
// while a seeded nemesis partitions, isolates, kills and restarts nodes,
// then heals, drains and checks the invariants.
func TestChaos(t *testing.T) {
	seeds, d := chaosKnobs(t)
	for _, seed := range seeds {
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			runChaos(t, seed, d)
		})
	}
}

func runChaos(t *testing.T, seed uint64, d time.Duration) {
	const n = 5
	rec := NewRecorder(int64(seed))
	c := New(t, n, sinks(rec, NoBug), WithSeed(seed))
	steps, err := PlanFaults(NemesisConfig{
		Seed: seed, Nodes: n, Duration: d, MinGap: 300 * time.Millisecond, MaxGap: 900 * time.Millisecond,
		Kinds: []FaultKind{FaultPartition, FaultIsolate, FaultKill, FaultRestart},
	})
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		for j := range n {
			if i == j {
				continue
			}
			wg.Go(func() {
				tick := time.NewTicker(40 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-tick.C:
					}
					if nd := c.Node(i); nd != nil {
						_, _ = SendReliable(ctx, rec, nd, c.Addr("sink", j))
					}
				}
			})
		}
	}
	nemErr := c.RunNemesis(ctx, steps, &log)
	cancel()
	wg.Wait()
	if nemErr != nil {
		t.Fatalf("%v\n%s", nemErr, log.String())
	}
	if err := c.WaitConverged(20 * time.Second); err != nil {
		t.Fatalf("seed %d: %v\n%s", seed, err, log.String())
	}
	if err := c.WaitDrained(30 * time.Second); err != nil {
		t.Fatalf("seed %d: %v\n%s", seed, err, log.String())
	}
	rep, err := c.Check(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatalf("%v\nschedule:\n%s", err, log.String())
	}
	if rep.Processed == 0 {
		t.Fatalf("seed %d: nothing was processed:\n%s", seed, rep)
	}
	t.Logf("seed %d:\n%s", seed, rep)
}

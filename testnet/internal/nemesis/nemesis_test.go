package nemesis

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func cfg(seed uint64) Config {
	return Config{Seed: seed, Nodes: 5, Duration: 20 * time.Second, MinGap: 200 * time.Millisecond, MaxGap: time.Second,
		Kinds: []Kind{Partition, Isolate, Kill, Restart}, Protect: []int{0}}
}

func TestSameSeedSameSchedule(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 99} {
		a, err := Plan(cfg(seed))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Plan(cfg(seed))
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d: two plans differ:\n%s\n%s", seed, Format(a), Format(b))
		}
		c, _ := Plan(cfg(seed + 1000))
		if reflect.DeepEqual(a, c) {
			t.Fatalf("seeds %d and %d gave the same plan", seed, seed+1000)
		}
	}
}

func TestScheduleIsConsistent(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		c := cfg(seed)
		steps, err := Plan(c)
		if err != nil {
			t.Fatal(err)
		}
		down := map[int]bool{}
		kinds := map[Kind]int{}
		var last time.Duration
		for _, s := range steps {
			kinds[s.Kind]++
			if s.At < last {
				t.Fatalf("seed %d: steps out of time order:\n%s", seed, Format(steps))
			}
			last = s.At
			switch s.Kind {
			case Kill:
				if down[s.Node] || s.Node == 0 {
					t.Fatalf("seed %d: bad kill of %d:\n%s", seed, s.Node, Format(steps))
				}
				down[s.Node] = true
				if len(down) > (c.Nodes-1)/2 {
					t.Fatalf("seed %d: %d nodes down at once", seed, len(down))
				}
			case Restart:
				if !down[s.Node] {
					t.Fatalf("seed %d: restart of running node %d", seed, s.Node)
				}
				delete(down, s.Node)
			case Isolate:
				if s.Node == 0 {
					t.Fatalf("seed %d: isolated a protected node", seed)
				}
			case Partition:
				if n := len(s.Groups[0]) + len(s.Groups[1]); n != c.Nodes || len(s.Groups[0]) == 0 || len(s.Groups[1]) == 0 {
					t.Fatalf("seed %d: bad partition %v", seed, s.Groups)
				}
			}
		}
		if len(down) != 0 {
			t.Fatalf("seed %d: schedule ends with nodes down: %v", seed, down)
		}
		if steps[len(steps)-1-countRestartsAtEnd(steps)].Kind != Heal {
			t.Fatalf("seed %d: schedule does not end healed:\n%s", seed, Format(steps))
		}
	}
}

func countRestartsAtEnd(steps []Step) int {
	n := 0
	for i := len(steps) - 1; i >= 0 && steps[i].Kind == Restart; i-- {
		n++
	}
	return n
}

func TestBadConfig(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"one node":  func(c *Config) { c.Nodes = 1 },
		"no time":   func(c *Config) { c.Duration = 0 },
		"bad gaps":  func(c *Config) { c.MinGap, c.MaxGap = time.Second, time.Millisecond },
		"no kinds":  func(c *Config) { c.Kinds = nil },
		"protect 9": func(c *Config) { c.Protect = []int{9} },
	} {
		c := cfg(1)
		mut(&c)
		if _, err := Plan(c); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: Plan = %v, want ErrBadConfig", name, err)
		}
	}
}

func BenchmarkPlan(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(cfg(7)); err != nil {
			b.Fatal(err)
		}
	}
}

// Advance and StepClock draw their durations from the config, and the same
// seed gives the same schedule.
func TestPlanClockFaults(t *testing.T) {
	cfg := Config{Seed: 9, Nodes: 4, Duration: 20 * time.Second, MinGap: 100 * time.Millisecond, MaxGap: 300 * time.Millisecond,
		Kinds: []Kind{Advance, StepClock}, Advances: []time.Duration{time.Hour}, Steps: []time.Duration{-time.Minute, time.Minute}}
	a, err := Plan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Plan(cfg)
	if Format(a) != Format(b) {
		t.Fatal("same seed, different schedules")
	}
	var adv, step int
	for _, s := range a {
		switch s.Kind {
		case Advance:
			adv++
			if s.Duration != time.Hour {
				t.Fatalf("advance by %v", s.Duration)
			}
		case StepClock:
			step++
			if s.Duration != time.Minute && s.Duration != -time.Minute || s.Node < 0 || s.Node >= 4 {
				t.Fatalf("bad step %v", s)
			}
		}
	}
	if adv == 0 || step == 0 {
		t.Fatalf("schedule without both kinds:\n%s", Format(a))
	}
	cfg.Advances = nil
	if _, err := Plan(cfg); err == nil {
		t.Fatal("Advance without durations accepted")
	}
}

// DiskFull names a node in range, prints as "disk-full N", and is planned
// like the other kinds.
func TestPlanDiskFull(t *testing.T) {
	cfg := Config{Seed: 3, Nodes: 3, Duration: 10 * time.Second, MinGap: 100 * time.Millisecond, MaxGap: 300 * time.Millisecond,
		Kinds: []Kind{DiskFull}}
	steps, err := Plan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	full := 0
	for _, s := range steps {
		if s.Kind != DiskFull {
			continue
		}
		full++
		if s.Node < 0 || s.Node >= 3 {
			t.Fatalf("disk-full of node %d of 3", s.Node)
		}
		if want := fmt.Sprintf("%v disk-full %d", s.At, s.Node); s.String() != want {
			t.Fatalf("%q, want %q", s.String(), want)
		}
	}
	if full == 0 {
		t.Fatalf("no disk-full in:\n%s", Format(steps))
	}
	if last := steps[len(steps)-1]; last.Kind != Heal {
		t.Fatalf("the schedule ends with %v, want a heal (which frees the disks)", last)
	}
}

// SyncFail takes a node out like Kill (at most MaxDown at once) and is
// followed by a Restart of it before the schedule ends.
func TestPlanSyncFail(t *testing.T) {
	cfg := Config{Seed: 5, Nodes: 5, Duration: 10 * time.Second, MinGap: 100 * time.Millisecond, MaxGap: 300 * time.Millisecond,
		Kinds: []Kind{SyncFail, Restart}}
	steps, err := Plan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	down := map[int]bool{}
	failed := 0
	for _, s := range steps {
		switch s.Kind {
		case SyncFail:
			failed++
			if down[s.Node] {
				t.Fatalf("sync-fail of node %d, already out:\n%s", s.Node, Format(steps))
			}
			if want := fmt.Sprintf("%v sync-fail %d", s.At, s.Node); s.String() != want {
				t.Fatalf("%q, want %q", s.String(), want)
			}
			down[s.Node] = true
			if len(down) > 2 {
				t.Fatalf("%d nodes out at once, MaxDown is 2:\n%s", len(down), Format(steps))
			}
		case Restart:
			if !down[s.Node] {
				t.Fatalf("restart of node %d, which is not out:\n%s", s.Node, Format(steps))
			}
			delete(down, s.Node)
		}
	}
	if failed == 0 || len(down) != 0 {
		t.Fatalf("%d sync-fails, %d nodes still out at the end:\n%s", failed, len(down), Format(steps))
	}
}

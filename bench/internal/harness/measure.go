package harness

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// sink counts received messages and remembers when the last one arrived,
// so a throughput figure ends at the last receive, not at the poll that saw it.
type sink struct {
	n    atomic.Int64
	last atomic.Int64 // unix nanoseconds of the latest hit
}

// add counts k messages received at once.
func (s *sink) add(k int64) {
	if k > 0 {
		s.n.Add(k)
		s.last.Store(time.Now().UnixNano())
	}
}

func (s *sink) hit() {
	s.n.Add(1)
	s.last.Store(time.Now().UnixNano())
}

// throughput sends until cfg.N messages or cfg.Duration, whichever comes
// first, then waits until the receiver has counted all of them (or lost()
// accounts for the rest) and returns msgs/s received, from the first send to
// the last receive. send must block or retry on back-pressure itself.
// flush (may be nil) pushes out what send buffered.
func throughput(cfg Config, what string, send, flush func() error, s *sink, lost func() int64) (rate float64, sent int64, err error) {
	start := time.Now()
	for sent < int64(cfg.N) {
		if sent%256 == 0 && time.Since(start) >= cfg.Duration {
			break
		}
		if err := send(); err != nil {
			return 0, sent, fmt.Errorf("bench: %s: send %d: %w", what, sent, err)
		}
		sent++
	}
	if flush != nil {
		if err := flush(); err != nil {
			return 0, sent, fmt.Errorf("bench: %s: flush: %w", what, err)
		}
	}
	if lost == nil {
		lost = func() int64 { return 0 }
	}
	if err := waitFor(cfg.Timeout, what+": all messages received", func() bool {
		return s.n.Load()+lost() >= sent
	}); err != nil {
		return 0, sent, fmt.Errorf("bench: %s: received %d of %d: %w", what, s.n.Load(), sent, err)
	}
	elapsed := time.Duration(s.last.Load() - start.UnixNano())
	if elapsed <= 0 {
		elapsed = time.Since(start)
	}
	return float64(s.n.Load()) / elapsed.Seconds(), sent, nil
}

// throughputCPU is throughput that also returns the CPU time the process
// spent per message sent (ns) from the first send until the last was
// received: both ends of a measurement run in the process (NATS's server
// too).
func throughputCPU(cfg Config, what string, send, flush func() error, s *sink, lost func() int64) (rate float64, sent int64, cpu float64, err error) {
	c0 := processCPU()
	rate, sent, err = throughput(cfg, what, send, flush, s, lost)
	if err == nil && sent > 0 {
		cpu = float64((processCPU() - c0).Nanoseconds()) / float64(sent)
	}
	return rate, sent, cpu, err
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// latencies runs cfg.Asks sequential round trips and returns p50 and p99.
func latencies(cfg Config, what string, rt func() error) (p50, p99 time.Duration, err error) {
	lat := make([]time.Duration, 0, cfg.Asks)
	// A short warm-up so connection setup and first allocations don't count.
	for i := 0; i < min(cfg.Asks/10+1, 200); i++ {
		if err := rt(); err != nil {
			return 0, 0, fmt.Errorf("bench: %s: warm-up: %w", what, err)
		}
	}
	for i := 0; i < cfg.Asks; i++ {
		t0 := time.Now()
		if err := rt(); err != nil {
			return 0, 0, fmt.Errorf("bench: %s: round trip %d: %w", what, i, err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	return percentile(lat, 50), percentile(lat, 99), nil
}

// percentile returns the p-th percentile of sorted (nearest rank).
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return sorted[i-1]
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// concurrentRoundTrips runs workers goroutines, each with its own round
// trip from newRT, back to back until cfg.Duration has passed or cfg.N
// round trips are done in all. It returns the round trips per second and
// the p50 and p99 of their latencies.
func concurrentRoundTrips(cfg Config, what string, workers int, newRT func() func() error) (rate float64, p50, p99 time.Duration, err error) {
	rts := make([]func() error, workers)
	for i := range rts {
		rts[i] = newRT()
	}
	var (
		wg    sync.WaitGroup
		total atomic.Int64
		errs  = make([]error, workers)
		lats  = make([][]time.Duration, workers)
	)
	start := time.Now()
	end := start.Add(cfg.Duration)
	for w := range workers {
		wg.Go(func() {
			for total.Load() < int64(cfg.N) {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				if err := rts[w](); err != nil {
					errs[w] = fmt.Errorf("bench: %s: asker %d, round trip %d: %w", what, w, len(lats[w]), err)
					return
				}
				lats[w] = append(lats[w], time.Since(t0))
				total.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, 0, err
	}
	all := slices.Concat(lats...)
	if len(all) == 0 {
		return 0, 0, 0, fmt.Errorf("bench: %s: no round trip finished in %v", what, cfg.Duration)
	}
	slices.Sort(all)
	return float64(len(all)) / elapsed.Seconds(), percentile(all, 50), percentile(all, 99), nil
}

// median returns the middle value of xs (the mean of the two middle ones
// for an even count); xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// roundsNote says a row's figures are medians of interleaved rounds and
// lists the ratio of each round, so a reader sees how far one slow moment
// of the host moved it. One round needs no note.
func roundsNote(mesh, other []float64) string {
	if len(mesh) < 2 {
		return ""
	}
	rs := make([]string, len(mesh))
	for i := range mesh {
		rs[i] = fmt.Sprintf("%.2f×", ratio(mesh[i], other[i]))
	}
	return fmt.Sprintf("median of %d interleaved rounds (each round's ratio: %s)", len(mesh), strings.Join(rs, " "))
}

// joinNotes joins the non-empty notes with "; ".
func joinNotes(notes ...string) string {
	return strings.Join(slices.DeleteFunc(notes, func(s string) bool { return s == "" }), "; ")
}

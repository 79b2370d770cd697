package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// childEnv carries the RSS child's job; its presence makes MaybeChild run it.
const childEnv = "MESHBENCH_RSS_CHILD"

// childJob is what the parent asks of the RSS child.
type childJob struct {
	Backlog int    `json:"backlog"`
	Payload int    `json:"payload"`
	WorkDir string `json:"work_dir"`
}

// childResult is the child's answer, one JSON line on stdout.
type childResult struct {
	BaselineKB int64  `json:"baseline_kb"` // VmRSS with the node started, outbox empty
	RSSKB      int64  `json:"rss_kb"`      // VmRSS with the backlog queued
	AnonKB     int64  `json:"anon_kb"`     // RssAnon part of RSSKB (heap, stacks)
	FileKB     int64  `json:"file_kb"`     // RssFile part of RSSKB (bbolt's mmap)
	Err        string `json:"err,omitempty"`
}

// MaybeChild runs the RSS child's job and exits the process when this
// process was started as that child; otherwise it returns at once. Call it
// first in main (and in TestMain of tests that run the rss phase).
func MaybeChild() {
	job := os.Getenv(childEnv)
	if job == "" {
		return
	}
	res := runChild(job)
	b, _ := json.Marshal(res) // a struct of ints and a string always encodes
	fmt.Println(string(b))
	if res.Err != "" {
		os.Exit(1)
	}
	os.Exit(0)
}

func runChild(jobJSON string) childResult {
	var job childJob
	if err := json.Unmarshal([]byte(jobJSON), &job); err != nil {
		return childResult{Err: fmt.Sprintf("decode job: %v", err)}
	}
	dir, err := os.MkdirTemp(job.WorkDir, "meshbench-rss-")
	if err != nil {
		return childResult{Err: err.Error()}
	}
	defer func() { _ = os.RemoveAll(dir) }()
	cfg := DefaultConfig()
	cfg.Payload, cfg.Backlog, cfg.WorkDir = job.Payload, job.Backlog, job.WorkDir
	e, err := newEnv(cfg, dir)
	if err != nil {
		return childResult{Err: err.Error()}
	}
	n, err := e.startNode("n1", "rss")
	if err != nil {
		return childResult{Err: err.Error()}
	}
	defer func() { _ = n.Close() }()
	runtime.GC()
	var res childResult
	if res.BaselineKB, _, _, err = readRSS(); err != nil {
		return childResult{Err: err.Error()}
	}
	if err := fillBacklog(n, []node.Address{node.Addr("w", "offline")}, job.Backlog, job.Payload); err != nil {
		return childResult{Err: err.Error()}
	}
	runtime.GC()
	if res.RSSKB, res.AnonKB, res.FileKB, err = readRSS(); err != nil {
		return childResult{Err: err.Error()}
	}
	return res
}

// readRSS reads VmRSS, RssAnon and RssFile (kB) from /proc/self/status.
func readRSS() (rss, anon, file int64, err error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: read /proc/self/status: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		x, perr := strconv.ParseInt(f[0], 10, 64)
		if perr != nil {
			continue
		}
		switch k {
		case "VmRSS":
			rss = x
		case "RssAnon":
			anon = x
		case "RssFile":
			file = x
		}
	}
	if rss == 0 {
		return 0, 0, 0, fmt.Errorf("bench: no VmRSS in /proc/self/status")
	}
	return rss, anon, file, nil
}

// rssPhase runs this executable again as the RSS child, so no other phase's
// garbage or caches count, and reports its RSS with the backlog queued.
func (e *env) rssPhase() ([]Row, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: rss: find executable: %w", err)
	}
	job, _ := json.Marshal(childJob{Backlog: e.cfg.Backlog, Payload: e.cfg.Payload, WorkDir: e.dir})
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$") // the flag only matters when exe is a test binary
	cmd.Env = append(os.Environ(), childEnv+"="+string(job))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var res childResult
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return nil, fmt.Errorf("%w: no result (exit: %w); stdout %q, stderr %q", ErrChild, exitErr(runErr), stdout.String(), stderr.String())
	}
	if res.Err != "" || runErr != nil {
		return nil, fmt.Errorf("%w: %s (exit: %w)", ErrChild, res.Err, exitErr(runErr))
	}
	mb := func(kb int64) float64 { return float64(kb) / 1024 }
	e.cfg.logf("rss: %.1f MB with %d queued (baseline %.1f MB)", mb(res.RSSKB), e.cfg.Backlog, mb(res.BaselineKB))
	row := Row{Phase: fmt.Sprintf("RSS with %d queued", e.cfg.Backlog), Meshnode: Figure{Value: mb(res.RSSKB), Unit: "MB"},
		Comparison: &Figure{Name: "same process, outbox empty", Value: mb(res.BaselineKB), Unit: "MB"},
		Ratio:      ratio(float64(res.RSSKB), float64(res.BaselineKB)), Target: "< 100 MB at 1M"}
	row.Note = fmt.Sprintf("anon %.1f MB, file (bbolt mmap) %.1f MB", mb(res.AnonKB), mb(res.FileKB))
	if e.cfg.Backlog >= 1_000_000 {
		row.Met = yesNo(mb(res.RSSKB) < 100)
	} else {
		proj := mb(res.BaselineKB) + (mb(res.RSSKB)-mb(res.BaselineKB))*1e6/float64(e.cfg.Backlog)
		row.Met = "n/a"
		row.Note += fmt.Sprintf("; linear projection to 1M: %.0f MB (run -backlog 1000000)", proj)
	}
	return []Row{row}, nil
}

// heapAlloc returns the heap in use after a GC, without goroutine stacks:
// stacks that grew while work ran shrink only at a later GC, and ±50 B per
// stream between runs of the stream row came from them, not from state.
func heapAlloc() uint64 { return memAfterGC().HeapAlloc }

// heapInUse returns heap plus goroutine stacks in use, after a GC.
func heapInUse() uint64 {
	ms := memAfterGC()
	return ms.HeapAlloc + ms.StackInuse
}

// memAfterGC reads the memory statistics after two collections (the
// second frees what the first's finalizers released).
func memAfterGC() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}

// actorsPhase spawns cfg.Actors idle actors on a node and reports the heap
// (and stack) growth per actor, against an idle goroutine-per-actor design
// (a goroutine blocked on its own channel).
func (e *env) actorsPhase() ([]Row, error) {
	n, err := e.startNode("n1", "actors")
	if err != nil {
		return nil, err
	}
	defer func() { _ = n.Close() }()
	h := func(ctx context.Context, m *node.Message) (proto.Message, error) { return nil, nil }
	before := heapInUse()
	for i := 0; i < e.cfg.Actors; i++ {
		if _, err := n.Spawn("a"+strconv.Itoa(i), h); err != nil {
			return nil, fmt.Errorf("bench: actors: spawn %d: %w", i, err)
		}
	}
	after := heapInUse()
	per := float64(int64(after)-int64(before)) / float64(e.cfg.Actors)
	if got := n.Stats().Actors; got != e.cfg.Actors {
		return nil, fmt.Errorf("bench: actors: node reports %d actors, want %d", got, e.cfg.Actors)
	}
	e.cfg.logf("actors: %.0f B per idle actor", per)

	g := goroutinePerActor(e.cfg.Actors)
	e.cfg.logf("actors: %.0f B per idle goroutine", g)
	rows := []Row{{Phase: fmt.Sprintf("memory per idle actor (%d actors)", e.cfg.Actors),
		Meshnode:   Figure{Value: per, Unit: "B"},
		Comparison: &Figure{Name: "goroutine blocked on its channel", Value: g, Unit: "B"}, Ratio: ratio(per, g),
		Target: "< 2048 B", Met: yesNo(per < 2048), Note: "heap + stacks after GC, default mailbox"}}
	sr, err := e.streamState(n)
	if err != nil {
		return nil, err
	}
	return append(rows, sr), nil
}

// streamState opens one reliable stream to each of up to 10,000 of n's
// idle actors from a second node, and reports the heap n keeps per stream
// once all were processed: the sender is closed before the measurement, so
// the figure is the receiver's alone (its watermark cache and whatever the
// actors kept), not the sender's outbox and relay state beside it.
func (e *env) streamState(n *node.Node) (Row, error) {
	k := min(e.cfg.Actors, 10_000)
	targets := make([]node.Address, k)
	for i := range targets {
		targets[i] = node.Addr("a"+strconv.Itoa(i), n.Name())
	}
	msg := wrapperspb.Bytes(make([]byte, e.cfg.Payload))
	streams0 := n.Stats().Streams
	before := heapAlloc()
	if err := e.sendOneEach(n, targets, msg); err != nil {
		return Row{}, err
	}
	if got := n.Stats().Streams - streams0; got < k {
		return Row{}, fmt.Errorf("bench: streams: %d of %d streams cached after the sender closed", got, k)
	}
	per := float64(int64(heapAlloc())-int64(before)) / float64(k)
	e.cfg.logf("streams: %.0f B per stream (%d streams)", per, k)
	return Row{Phase: fmt.Sprintf("receiver state per stream (%d streams)", k), Meshnode: Figure{Value: per, Unit: "B"},
		Target: "< 256 B", Met: yesNo(per < 256),
		Note: "receiver's heap (no stacks) after GC per stream, one message each from another node (closed before measuring), short names (a0…, n2). " +
			"Longer names cost more: node's BenchmarkReceiverStreamState uses 32-byte ones"}, nil
}

// sendOneEach starts a sender node joined to n, sends one reliable message
// to each target, waits until n has cached a stream for each and the
// sender's outbox is empty, and closes the sender.
func (e *env) sendOneEach(n *node.Node, targets []node.Address, msg proto.Message) error {
	streams0 := n.Stats().Streams
	g0 := runtime.NumGoroutine()
	s, err := e.startNode("n2", "actors", n.GossipAddr())
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }()
	if err := waitFor(10*time.Second, "n1 and n2 see each other alive", func() bool {
		return seesAlive(n, "n2") && seesAlive(s, "n1")
	}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	for i := 0; i < len(targets); i += 1024 {
		res, err := s.Dispatch(ctx, targets[i:min(i+1024, len(targets))], msg)
		if err != nil {
			return fmt.Errorf("bench: streams: dispatch: %w", err)
		}
		for _, err := range res.Errors {
			return fmt.Errorf("bench: streams: dispatch: %d rejected: %w", res.Rejected, err)
		}
	}
	if err := waitFor(e.cfg.Timeout, "every stream processed", func() bool {
		return n.Stats().Streams-streams0 >= len(targets) && s.Outbox().Stats().Depth == 0
	}); err != nil {
		return fmt.Errorf("bench: streams: %d of %d streams, depth %d: %w", n.Stats().Streams-streams0, len(targets), s.Outbox().Stats().Depth, err)
	}
	if err := s.Close(); err != nil {
		return fmt.Errorf("bench: streams: close the sender: %w", err)
	}
	// The receiver's side of the connection is not stream state: wait
	// until it is gone too.
	if err := waitFor(10*time.Second, "n1 drops its connection to the closed n2", func() bool {
		return !n.PeerStats()["n2"].Connected
	}); err != nil {
		return err
	}
	// Nor is the closed sender: a few of its goroutines end after Close
	// returns (memberlist's probes end within a probe timeout) and keep its
	// relay, outbox and QUIC state reachable until they do, which put
	// 80 B per stream into the figure in about one run of three.
	if err := waitFor(10*time.Second, "the closed n2's goroutines end", func() bool {
		return runtime.NumGoroutine() <= g0
	}); err != nil {
		e.cfg.logf("streams: %v (%d goroutines, %d before the sender started); measuring anyway", err, runtime.NumGoroutine(), g0)
	}
	return nil
}

// goroutinePerActor measures k goroutines each blocked on its own channel,
// the naive actor design, and ends them before returning.
func goroutinePerActor(k int) float64 {
	before := heapInUse()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	chans := make([]chan int, k)
	for i := range chans {
		chans[i] = make(chan int)
		wg.Add(1)
		go func(c chan int) {
			defer wg.Done()
			select {
			case <-c:
			case <-stop:
			}
		}(chans[i])
	}
	after := heapInUse()
	close(stop)
	wg.Wait()
	runtime.KeepAlive(chans)
	return float64(int64(after)-int64(before)) / float64(k)
}

// exitErr is the child's exit error, or one saying it exited cleanly.
func exitErr(err error) error {
	if err == nil {
		return errors.New("status 0")
	}
	return err
}

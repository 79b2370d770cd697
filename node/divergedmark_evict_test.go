package node_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// x (at the watermark, other contents) of a restored sender marks the
// stream divergent (answered CAPACITY until the mark is on disk, then
// DIVERGED); the disk is full, so the mark's commit fails, while idle
// streams are evicted again and again. The stream
// must stay cached until the mark is on disk: the mark does not move the
// watermark, so "durable == w" says nothing, and a stream evicted between
// the failed commit and its retry, or (its actor absent) between its
// lookup and its mark, was loaded again from disk unmarked; y of the old
// epoch, chained to the watermark, then ran after x of its emission was
// answered DIVERGED, and again in the new epoch (twice, and before x).
// Now eviction skips a stream whose digest or mark is not on disk, and
// the absent-actor check holds its stream until it is marked.
func TestDivergenceMarkOutlastsEvictionWhileTheDiskRefusesIt(t *testing.T) {
	t.Run("actor present", func(t *testing.T) { evictMark(t, false) })
	t.Run("actor absent", func(t *testing.T) { evictMark(t, true) })
}

func evictMark(t *testing.T, absent bool) {
	const streams = 400
	dir := t.TempDir()
	n := newNode(t, "n1", dir, func(c *node.Config) {})
	var s sink
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	// One stream per epoch: a ran at 1 (the watermark, digest of a).
	for e := uint64(1); e <= streams; e++ {
		n.DeliverIncoming(peerP, epochEnv(t, e, 1, 0, "a"), rs.reply(fmt.Sprintf("a-1-e%d", e)))
	}
	testutil.WaitFor(t, 30*time.Second, "a ran on every stream", func() bool { return rs.len() >= streams })
	for e := uint64(1); e <= streams; e++ {
		if c := rs.code(fmt.Sprintf("a-1-e%d", e)); c != pb.Receipt_PROCESSED {
			t.Fatalf("a of epoch %d: %v", e, c)
		}
	}
	if absent {
		if err := n.Stop("sink"); err != nil {
			t.Fatal(err)
		}
	}
	restore, _ := faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()

	markWhileEvicting(t, n, &rs, streams)
	if absent {
		if _, err := n.Spawn("sink", s.handler); err != nil {
			t.Fatal(err)
		}
	}
	// y of the old epoch (chained to the watermark), sent in the same
	// emission as x, arrives once the sink is back.
	sent := 0
	for e := uint64(1); e <= streams; e++ {
		if !rs.marked(fmt.Sprintf("x-1-e%d", e)) {
			continue
		}
		sent++
		n.DeliverIncoming(peerP, epochEnv(t, e, 2, 1, fmt.Sprintf("y%d", e)), rs.reply(fmt.Sprintf("y%d-2-e%d", e, e)))
	}
	if sent == 0 {
		t.Fatal("no x found the stream divergent")
	}
	testutil.WaitFor(t, 30*time.Second, "y answered", func() bool { return rs.len() >= 2*streams+sent })
	noOldEpochRan(t, s.values())
}

// marked reports whether the message id was answered as one of a stream
// marked divergent: DIVERGED, or CAPACITY while the mark is not on disk.
func (r *receipts) marked(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rc := r.got[id]
	return rc.GetCode() == pb.Receipt_DIVERGED ||
		rc.GetCode() == pb.Receipt_CAPACITY && strings.Contains(rc.GetMessage(), "divergence not durable")
}

// epochEnv is stringEnv on stream epoch (one stream per epoch), its msg id
// naming value, sequence and epoch.
func epochEnv(t *testing.T, epoch, seq, prev uint64, v string) *pb.Envelope {
	e := stringEnv(t, seq, prev, v)
	e.StreamEpoch = epoch
	e.MsgId = fmt.Sprintf("%s-%d-e%d", v, seq, epoch)
	return e
}

// markWhileEvicting delivers x (sequence 1, other contents than a, which
// ran there) on streams streams while the cache is swept again and again,
// waits for every answer, and returns how many found the stream divergent
// (receipts.marked).
func markWhileEvicting(t *testing.T, n *node.Node, rs *receipts, streams int) int {
	t.Helper()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var evicted atomic.Int64
	wg.Go(func() {
		for !stop.Load() {
			evicted.Add(int64(n.EvictIdleStreams(-time.Hour)))
		}
	})
	for e := uint64(1); e <= uint64(streams); e++ {
		n.DeliverIncoming(peerP, epochEnv(t, e, 1, 0, "x"), rs.reply(fmt.Sprintf("x-1-e%d", e)))
	}
	testutil.WaitFor(t, 30*time.Second, "x answered on every stream", func() bool { return rs.len() >= 2*streams })
	stop.Store(true)
	wg.Wait()
	diverged := 0
	for e := uint64(1); e <= uint64(streams); e++ {
		if rs.marked(fmt.Sprintf("x-1-e%d", e)) {
			diverged++
		}
	}
	t.Logf("x found %d of %d streams divergent; %d evictions", diverged, streams, evicted.Load())
	return diverged
}

// noOldEpochRan fails t if any y (of the old epoch, after x of its
// emission was answered DIVERGED) is among the values the sink ran.
func noOldEpochRan(t *testing.T, ran []string) {
	t.Helper()
	var ranY []string
	for _, v := range ran {
		if strings.HasPrefix(v, "y") {
			ranY = append(ranY, v)
		}
	}
	if len(ranY) > 0 {
		t.Fatalf("%d streams ran y of the old epoch after x of the same emission was answered DIVERGED (e.g. %v): the stream was evicted before its mark of divergence was on disk", len(ranY), ranY[:min(5, len(ranY))])
	}
}

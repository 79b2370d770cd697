package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// The same for a message refused for room by an actor that is there: x,
// at the watermark with other contents, meets a full mailbox, is answered
// DIVERGED and marks the stream, its commit refused by a full disk, while
// idle streams are evicted again and again. The stream is held from the
// refusal to the mark: evicted in between, the mark landed on an object
// no longer cached, the next lookup loaded the stream from disk unmarked,
// and y of the old epoch, chained to the watermark, ran although x of its
// emission was answered DIVERGED.
func TestRoomRefusalsMarkOfDivergenceOutlastsEviction(t *testing.T) {
	const streams = 400
	dir := t.TempDir()
	n := newNode(t, "n1", dir, func(c *node.Config) {})
	h := newHoldSink("hold")
	defer h.freeAll()
	if _, err := n.Spawn("sink", h.handler, node.WithMailbox(2, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	env := func(epoch, seq, prev uint64, v string) *pb.Envelope {
		e := stringEnv(t, seq, prev, v)
		e.StreamEpoch = epoch
		e.MsgId = fmt.Sprintf("%s-%d-e%d", v, seq, epoch)
		return e
	}
	for e := uint64(1); e <= streams; e++ {
		n.DeliverIncoming(peerP, env(e, 1, 0, "a"), rs.reply(fmt.Sprintf("a-1-e%d", e)))
		// one at a time: the mailbox holds 2
		testutil.WaitFor(t, 10*time.Second, "a ran", func() bool { return rs.len() >= int(e) })
		if c := rs.code(fmt.Sprintf("a-1-e%d", e)); c != pb.Receipt_PROCESSED {
			t.Fatalf("a of epoch %d: %v", e, c)
		}
	}
	// Hold the actor and fill its mailbox with local tells.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Tell(ctx, node.Addr("sink", "n1"), wrapperspb.String("hold")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.started["hold"]:
	case <-time.After(10 * time.Second):
		t.Fatal("hold did not start")
	}
	for i := 0; i < 2; i++ {
		if err := n.Tell(ctx, node.Addr("sink", "n1"), wrapperspb.String(fmt.Sprintf("f%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	restore, _ := faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()

	var stop atomic.Bool
	var wg sync.WaitGroup
	var evicted atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			evicted.Add(int64(n.EvictIdleStreams(-time.Hour)))
		}
	}()
	for e := uint64(1); e <= streams; e++ {
		n.DeliverIncoming(peerP, env(e, 1, 0, "x"), rs.reply(fmt.Sprintf("x-1-e%d", e)))
	}
	testutil.WaitFor(t, 30*time.Second, "x answered on every stream", func() bool { return rs.len() >= 2*streams })
	stop.Store(true)
	wg.Wait()
	diverged := 0
	for e := uint64(1); e <= streams; e++ {
		if c := rs.code(fmt.Sprintf("x-1-e%d", e)); c == pb.Receipt_DIVERGED {
			diverged++
		}
	}
	t.Logf("x answered DIVERGED on %d of %d streams; %d evictions", diverged, streams, evicted.Load())
	if diverged == 0 {
		t.Fatal("no x was answered DIVERGED: the fixture did not refuse x for room")
	}
	h.free("hold")
	testutil.WaitFor(t, 10*time.Second, "fills ran", func() bool {
		c := 0
		for _, v := range h.values() {
			if strings.HasPrefix(v, "f") {
				c++
			}
		}
		return c == 2
	})
	sent := 0
	for e := uint64(1); e <= streams; e++ {
		if rs.code(fmt.Sprintf("x-1-e%d", e)) != pb.Receipt_DIVERGED {
			continue
		}
		sent++
		n.DeliverIncoming(peerP, env(e, 2, 1, fmt.Sprintf("y%d", e)), rs.reply(fmt.Sprintf("y%d-2-e%d", e, e)))
		want := 2*streams + sent
		testutil.WaitFor(t, 10*time.Second, "y answered", func() bool { return rs.len() >= want })
	}
	var ranY []string
	for _, v := range h.values() {
		if strings.HasPrefix(v, "y") {
			ranY = append(ranY, v)
		}
	}
	if len(ranY) > 0 {
		shown := ranY
		if len(shown) > 5 {
			shown = shown[:5]
		}
		t.Fatalf("%d streams ran y of the old epoch after x of the same emission was answered DIVERGED for room (e.g. %v): the stream was evicted between receive's get and divergentAtRoom's mark", len(ranY), shown)
	}
}

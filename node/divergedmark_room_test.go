package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
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
	for e := uint64(1); e <= streams; e++ {
		n.DeliverIncoming(peerP, epochEnv(t, e, 1, 0, "a"), rs.reply(fmt.Sprintf("a-1-e%d", e)))
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

	if markWhileEvicting(t, n, &rs, streams) == 0 {
		t.Fatal("no x found its stream divergent: the fixture did not refuse x for room")
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
		if !rs.marked(fmt.Sprintf("x-1-e%d", e)) {
			continue
		}
		sent++
		n.DeliverIncoming(peerP, epochEnv(t, e, 2, 1, fmt.Sprintf("y%d", e)), rs.reply(fmt.Sprintf("y%d-2-e%d", e, e)))
		want := 2*streams + sent
		testutil.WaitFor(t, 10*time.Second, "y answered", func() bool { return rs.len() >= want })
	}
	noOldEpochRan(t, h.values())
}

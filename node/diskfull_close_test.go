package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Many streams' watermark commits refused, their retry timers pending and
// firing, when the receiver closes (gracefully or as a crash): Close must
// return promptly, race-clean and leak-free.
func TestCloseWithManyCommitRetriesPending(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprint("kill=", kill), func(t *testing.T) {
			dirs := [2]string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
			n0 := startNodeWith(t, "n0", dirs[0], func(cfg *node.Config) { cfg.Outbox.MaxClockSkew = 0 })
			n1 := startNode(t, "n1", dirs[1], n0.GossipAddr())
			waitAlive(t, []*node.Node{n0, n1}, 2)
			restore, hits := faults.FailCommits(filepath.Join(dirs[1], "outbox.db"), errors.New("write outbox.db: no space left on device"))
			defer restore()
			const streams = 30
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for i := range streams {
				to, err := n1.Spawn(fmt.Sprint("w", i), func(context.Context, *node.Message) (proto.Message, error) { return nil, nil })
				if err != nil {
					t.Fatal(err)
				}
				if _, err := n0.TellReliable(ctx, to, wrapperspb.String("m"), node.WithTTL(500*time.Millisecond)); err != nil {
					t.Fatal(err)
				}
			}
			testutil.WaitFor(t, 20*time.Second, "many refused commits (retries under way)", func() bool { return hits() >= 3*streams })
			done := make(chan error, 1)
			go func() {
				if kill {
					done <- n1.Kill()
				} else {
					done <- n1.Close()
				}
			}()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				t.Fatal("Close hung with commit retries pending")
			}
		})
	}
}

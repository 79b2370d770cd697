package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/node/nodetest"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The daemon's inbox actor (Handler + BatchHandler, as cmd/meshnode
// spawns it) in front of a small inbox that a slow program drains: batches
// are cut by ErrFull part way, again and again. Every message must reach
// the program once, in order, and none be charged an attempt (MaxAttempts
// 1 dead-letters at the first).
//
// Under -race it also checks that Append and AppendBatch read the inbox's
// count for their ErrFull message under the store's mutex, not after
// releasing it while AckUpTo and other appends change it.
func TestInboxPartialFillsUnderReliableLoad(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	st, err := inbox.Open(func() inbox.Config {
		c := inbox.DefaultConfig(filepath.Join(t.TempDir(), "inbox.db"))
		c.MaxMessages = 7
		return c
	}())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.Declare("box"); err != nil {
		t.Fatal(err)
	}
	c := nodetest.New(t, []string{"s1", "s2", "d"},
		nodetest.WithConfig(func(cfg *node.Config) { cfg.Outbox.MaxAttempts = 1 }),
		nodetest.WithSetup(func(n *node.Node) error {
			if n.Name() != "d" {
				return nil
			}
			_, err := n.Spawn("box", inbox.Handler(st, "box"), node.WithBatch(inbox.BatchHandler(st, "box"), inbox.ActorBatch))
			return err
		}))
	const per = 60
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range []string{"s1", "s2"} {
		wg.Go(func() {
			for i := range per {
				if _, err := c.Node(s).TellReliable(ctx, node.Addr("box", "d"), wrapperspb.String(fmt.Sprintf("%s/%d", s, i))); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	// The program: pulls a few, acks them, repeats.
	got := map[string][]int{}
	var after uint64
	testutil.WaitFor(t, 60*time.Second, "the program got everything", func() bool {
		msgs, err := st.Pull(ctx, "box", after, 3, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			var v wrapperspb.StringValue
			if err := m.GetBody().UnmarshalTo(&v); err != nil {
				t.Fatal(err)
			}
			var s string
			var i int
			if _, err := fmt.Sscanf(v.GetValue(), "%2s/%d", &s, &i); err != nil {
				t.Fatal(err)
			}
			got[s] = append(got[s], i)
			after = m.GetEventSeq()
		}
		if len(msgs) > 0 {
			if _, err := st.AckUpTo("box", after); err != nil && !errors.Is(err, inbox.ErrAckBeyond) {
				t.Fatal(err)
			}
		}
		return len(got["s1"]) >= per && len(got["s2"]) >= per
	})
	wg.Wait()
	for _, s := range []string{"s1", "s2"} {
		for i, v := range got[s] {
			if v != i {
				t.Fatalf("%s: the program got %v: order broken or repeated at %d", s, got[s], i)
			}
		}
		dl, err := c.Node(s).Outbox().DeadLetters(outbox.DLQFilter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(dl) != 0 {
			t.Fatalf("%s dead-lettered %d healthy messages, first: %s", s, len(dl), dl[0].Reason)
		}
	}
}

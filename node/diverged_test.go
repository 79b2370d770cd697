package node_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
)

// A sender restored from a backup of its outbox reuses sequences its
// receiver has seen. While the receiver is away the new messages queue and
// then go out in one emission that reaches past the receiver's watermark,
// so the watermark is not above everything the stream sent: the message
// at the watermark's sequence, another than the one that ran there, gives
// the restore away (DIVERGED). The stream starts a new epoch and every new
// message runs, in order; none is taken for a copy.
func TestRestoredSendersBurstPastTheWatermarkRuns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spawn func(n *node.Node, s *sink) error
	}{
		{"handler", func(n *node.Node, s *sink) error {
			_, err := n.Spawn("sink", s.handler)
			return err
		}},
		{"batch handler", func(n *node.Node, s *sink) error {
			_, err := n.Spawn("sink", s.handler, node.WithBatch(func(ctx context.Context, msgs []*node.Message) (int, error) {
				for i, m := range msgs {
					if _, err := s.handler(ctx, m); err != nil {
						return i, err
					}
				}
				return len(msgs), nil
			}, 16))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			d1, d2 := filepath.Join(dir, "n1"), filepath.Join(dir, "n2")
			edit := func(c *node.Config) { fastRetries(c); c.Outbox.SequenceBlock = 1 }
			var s sink
			n2 := newNode(t, "n2", d2, func(*node.Config) {})
			if err := tc.spawn(n2, &s); err != nil {
				t.Fatal(err)
			}
			n1 := newNode(t, "n1", d1, edit, n2.GossipAddr())
			waitAlive(t, []*node.Node{n1, n2}, 2)
			send := func(v string) node.Outcome {
				t.Helper()
				out, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String(v))
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			send("a")
			s.waitLen(t, 1)
			if err := n1.Close(); err != nil {
				t.Fatal(err)
			}
			copyDir(t, d1, filepath.Join(dir, "backup"))
			n1 = newNode(t, "n1", d1, edit, n2.GossipAddr())
			waitAlive(t, []*node.Node{n1, n2}, 2)
			send("b")
			send("c")
			s.waitLen(t, 3)
			testutil.WaitFor(t, 10*time.Second, "b, c acked", func() bool { return n1.Outbox().Stats().Depth == 0 })
			for _, n := range []*node.Node{n1, n2} {
				if err := n.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.RemoveAll(d1); err != nil {
				t.Fatal(err)
			}
			copyDir(t, filepath.Join(dir, "backup"), d1) // the outbox goes back to before b and c

			n1 = newNode(t, "n1", d1, edit)
			burst := []string{"w", "x", "y", "z"} // under the sequences of b, c and two more
			for _, v := range burst {
				if out := send(v); out != node.Queued {
					t.Fatalf("%s with its receiver down: %v, want Queued", v, out)
				}
			}
			n2 = newNode(t, "n2", d2, func(*node.Config) {}, n1.GossipAddr())
			if err := tc.spawn(n2, &s); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, 15*time.Second, "burst delivered", func() bool { return n1.Outbox().Stats().Depth == 0 })
			want := append([]string{"a", "b", "c"}, burst...)
			if got := s.values(); !slices.Equal(got, want) {
				t.Fatalf("sink ran %v, want %v", got, want)
			}
			if st := n2.Stats(); st.Diverged == 0 {
				t.Fatal("no message answered DIVERGED")
			}
			if dl := deadLetters(t, n1); len(dl) != 0 {
				t.Fatalf("dead letters %+v", dl)
			}
		})
	}
}

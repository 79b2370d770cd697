package inbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/node/nodetest"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A daemon whose disk refuses the inbox's writes cannot store what it is
// sent. That is its trouble, not the messages': the inbox actor answers as
// a full inbox does (the sender backs off, uncounted), and a sender with
// MaxAttempts 1, which dead-letters at the first counted failure, keeps
// its messages until the disk takes them. Store errors are ErrWrite.
func TestInboxDiskFullIsNotChargedToTheMessages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	st := openStore(t, path, nil)
	if _, err := st.Declare("box"); err != nil {
		t.Fatal(err)
	}
	restore, hits := faults.FailCommits(path, errors.New("write inbox.db: no space left on device"))
	defer restore()
	if _, err := st.Append(context.Background(), "box", env("m0")); !errors.Is(err, inbox.ErrWrite) {
		t.Fatalf("Append on a full disk: %v, want ErrWrite", err)
	}
	if _, _, err := st.AppendBatch(context.Background(), "box", envs(0, 2)); !errors.Is(err, inbox.ErrWrite) {
		t.Fatalf("AppendBatch on a full disk: %v, want ErrWrite", err)
	}

	c := nodetest.New(t, []string{"s", "d"},
		nodetest.WithConfig(func(cfg *node.Config) { cfg.Outbox.MaxAttempts = 1 }),
		nodetest.WithSetup(func(n *node.Node) error {
			if n.Name() != "d" {
				return nil
			}
			_, err := n.Spawn("box", inbox.Handler(st, "box"), node.WithBatch(inbox.BatchHandler(st, "box"), inbox.ActorBatch))
			return err
		}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := hits()
	for _, v := range []string{"a", "b", "c"} {
		if out, err := c.Node("s").TellReliable(ctx, node.Addr("box", "d"), wrapperspb.String(v)); err != nil || out == node.DeadLettered {
			t.Fatalf("TellReliable(%s) = %v, %v", v, out, err)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "two more refused inbox commits (or a dead letter)", func() bool {
		return hits() >= before+2 || c.Node("s").Outbox().Stats().DLQDepth > 0
	})
	if dl, _ := c.Node("s").Outbox().DeadLetters(outbox.DLQFilter{}); len(dl) > 0 {
		t.Fatalf("the daemon's full disk dead-lettered %d healthy messages, first: %s", len(dl), dl[0].Reason)
	}
	restore()
	// Depth counts an append under way from its start; the last cursor
	// moves at its commit.
	testutil.WaitFor(t, 60*time.Second, "the three messages in the inbox", func() bool {
		s := st.Stats()["box"]
		return s.Depth == 3 && s.LastCursor == 3
	})
	msgs, err := st.Pull(ctx, "box", 0, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"a", "b", "c"} {
		var v wrapperspb.StringValue
		if err := msgs[i].GetBody().UnmarshalTo(&v); err != nil || v.GetValue() != want {
			t.Fatalf("message %d = %q (%v), want %q: order broken", i, v.GetValue(), err, want)
		}
	}
	if n := c.Node("s").Outbox().Stats().DLQDepth; n != 0 {
		t.Fatalf("%d dead letters, want none", n)
	}
}

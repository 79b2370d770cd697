package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
)

// marked returns envelopes named "<stream><seq>" for the sequences from..to
// of stream, with their marks.
func marked(stream string, from, to uint64) ([]*pb.Envelope, []inbox.Mark) {
	var envs []*pb.Envelope
	var marks []inbox.Mark
	for s := from; s <= to; s++ {
		envs = append(envs, env(fmt.Sprint(stream, s)))
		marks = append(marks, inbox.Mark{Stream: []byte(stream), Seq: s})
	}
	return envs, marks
}

// A receiver that dies after its inbox stored messages and before their
// stream's watermark was committed gets them again. Marked with their
// stream and sequence, the copies are not stored a second time, also
// after the store is reopened, while later messages and unmarked ones
// (tell, ask) are; the depth counts what is stored.
func TestMarkedCopiesAreStoredOnce(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "inbox.db")
	s := openStore(t, path, nil)
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	a, am := marked("a", 1, 5)
	b, bm := marked("b", 1, 3)
	all := append(append(append([]*pb.Envelope{}, a[:3]...), b...), a[3:]...) // streams interleaved
	marks := append(append(append([]inbox.Mark{}, am[:3]...), bm...), am[3:]...)
	if first, n, err := s.AppendBatchMarked(ctx, "box", all, marks); err != nil || n != 8 || first != 1 {
		t.Fatalf("first batch: first %d n %d err %v; want 1, 8, nil", first, n, err)
	}
	// The copies of a3..a5 come again with a6, a7 and an unmarked message.
	again, againMarks := marked("a", 3, 7)
	again = append(again, env("tell"))
	againMarks = append(againMarks, inbox.Mark{})
	if first, n, err := s.AppendBatchMarked(ctx, "box", again, againMarks); err != nil || n != 6 || first != 9 {
		t.Fatalf("copies: first %d n %d err %v; want 9 (a6's cursor), 6 handled, nil", first, n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, path, nil)
	// After a restart: a7 again (its cursor comes back), a6 (an older
	// copy: no cursor), b4 (new).
	if cur, err := s.AppendMarked(ctx, "box", env("a7"), inbox.Mark{Stream: []byte("a"), Seq: 7}); err != nil || cur != 10 {
		t.Fatalf("copy of a7 after reopening: cursor %d err %v; want 10 (its first cursor)", cur, err)
	}
	if cur, err := s.AppendMarked(ctx, "box", env("a6"), inbox.Mark{Stream: []byte("a"), Seq: 6}); err != nil || cur != 0 {
		t.Fatalf("copy of a6 after reopening: cursor %d err %v; want 0 (stored before, not the stream's last)", cur, err)
	}
	if cur, err := s.AppendMarked(ctx, "box", env("b4"), inbox.Mark{Stream: []byte("b"), Seq: 4}); err != nil || cur != 12 {
		t.Fatalf("b4: cursor %d err %v; want 12", cur, err)
	}
	if _, n, err := s.AppendBatchMarked(ctx, "box", []*pb.Envelope{env("x")}, nil); err != nil || n != 1 {
		t.Fatalf("unmarked batch: n %d err %v", n, err)
	}
	msgs, err := s.Pull(ctx, "box", 0, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a1", "a2", "a3", "b1", "b2", "b3", "a4", "a5", "a6", "a7", "tell", "b4", "x"}
	if got := ids(msgs); !slices.Equal(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
	if st := s.Stats()["box"]; st.Depth != len(want) || st.LastCursor != uint64(len(want)) {
		t.Fatalf("depth %d last cursor %d, want %d and %d", st.Depth, st.LastCursor, len(want), len(want))
	}
	if _, _, err := s.AppendBatchMarked(ctx, "box", []*pb.Envelope{env("y")}, []inbox.Mark{{}, {}}); err == nil {
		t.Fatal("two marks for one message accepted")
	}
}

// What the inbox stored of a stream is what its actor tells the node it
// applied (node.WithApplied), under the stream key the actor marks with.
func TestAppliedIsTheStreamsLastStoredSequence(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), nil)
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	id := node.StreamID{Node: "n0", Outbox: [16]byte{1}, Epoch: 3, Actor: "box"}
	key := outbox.StreamKey(id.Node, id.Outbox, id.Epoch, id.Actor)
	envs := []*pb.Envelope{env("a"), env("b")}
	if _, _, err := s.AppendBatchMarked(context.Background(), "box", envs, []inbox.Mark{{Stream: key, Seq: 4}, {Stream: key, Seq: 9}}); err != nil {
		t.Fatal(err)
	}
	applied := inbox.Applied(s)
	if got := applied(id); got != 9 {
		t.Fatalf("applied = %d, want 9", got)
	}
	other := id
	other.Epoch = 4
	if got := applied(other); got != 0 {
		t.Fatalf("applied for another epoch = %d, want 0", got)
	}
}

// Streams the node forgot lose their records here too (through a
// Forgetter, as the daemon wires it to the node's outbox), as far as the
// forgotten watermark went: a forgotten stream's next message is stored as
// new, a record above the forgotten watermark and the others' stay.
func TestForgottenStreamsLoseTheirMarks(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), nil)
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	a, am := marked("a", 1, 3)
	b, bm := marked("b", 1, 2)
	if _, n, err := s.AppendBatchMarked(ctx, "box", append(a, b...), append(am, bm...)); err != nil || n != 5 {
		t.Fatalf("append: %d, %v", n, err)
	}
	// b's record (2) is above the watermark the node forgot (1): after a
	// crash, or stored after the node decided; a copy of b2 would pass
	// the node, so the record stays.
	if err := s.ForgetStreams([]outbox.ForgottenStream{{Stream: []byte("b"), Watermark: 1}}); err != nil {
		t.Fatal(err)
	}
	if got := s.Applied([]byte("b")); got != 2 {
		t.Fatalf("b's record after forgetting watermark 1: %d, want 2 kept", got)
	}
	f := inbox.NewForgetter(s, slog.New(slog.DiscardHandler))
	f.Add([]outbox.ForgottenStream{{Stream: []byte("a"), Watermark: 3}})
	testutil.WaitFor(t, 5*time.Second, "a forgotten", func() bool { return s.Applied([]byte("a")) == 0 })
	f.Close()
	f.Add([]outbox.ForgottenStream{{Stream: []byte("b"), Watermark: 2}}) // after Close: not taken
	if got := s.Applied([]byte("b")); got != 2 {
		t.Fatalf("b's record: %d, want 2", got)
	}
	if cur, err := s.AppendMarked(ctx, "box", env("a1"), inbox.Mark{Stream: []byte("a"), Seq: 1}); err != nil || cur == 0 {
		t.Fatalf("a1 of the forgotten stream: cursor %d, %v; want it stored", cur, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.ForgetStreams([]outbox.ForgottenStream{{Stream: []byte("b"), Watermark: 2}}); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("forget on a closed store: %v, want ErrClosed", err)
	}
}

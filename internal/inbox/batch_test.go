package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func envs(from, n int) []*pb.Envelope {
	out := make([]*pb.Envelope, n)
	for i := range out {
		out[i] = env(fmt.Sprint("m", from+i))
	}
	return out
}

// TestAppendBatch: one call stores the messages in order with consecutive
// cursors, after what single appends stored, and leaves the caller's
// envelopes alone.
func TestAppendBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	s := openStore(t, path, nil)
	_, _ = s.Declare("box")
	appendN(t, s, "box", 0, 2)
	batch := envs(2, 3)
	body, _ := anypb.New(wrapperspb.String("payload"))
	batch[1].Body = body
	batch[2].EventSeq = 99 // the sender's own use of the field; the cursor replaces it
	first, n, err := s.AppendBatch(context.Background(), "box", batch)
	if err != nil || first != 3 || n != 3 {
		t.Fatalf("AppendBatch = %d, %d, %v; want 3, 3, nil", first, n, err)
	}
	if batch[0].GetEventSeq() != 0 || batch[2].GetEventSeq() != 99 {
		t.Fatal("AppendBatch wrote to the caller's envelopes")
	}
	if st := s.Stats()["box"]; st.Depth != 5 || st.LastCursor != 5 {
		t.Fatalf("stats %+v, want depth 5, last 5", st)
	}
	check := func(s *inbox.Store) {
		t.Helper()
		msgs, err := s.Pull(context.Background(), "box", 0, 100, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(ids(msgs)); got != "[m0 m1 m2 m3 m4]" {
			t.Fatalf("pull = %s", got)
		}
		for i, m := range msgs {
			if m.GetEventSeq() != uint64(i+1) {
				t.Fatalf("cursor of %s = %d, want %d", m.GetMsgId(), m.GetEventSeq(), i+1)
			}
		}
		var v wrapperspb.StringValue
		if err := msgs[3].GetBody().UnmarshalTo(&v); err != nil || v.GetValue() != "payload" {
			t.Fatalf("body of m3 = %q, %v", v.GetValue(), err)
		}
	}
	check(s)
	// Durable: the same after a restart.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check(openStore(t, path, nil))
}

// TestAppendBatchFull: a batch larger than the room left stores the first
// ones that fit and refuses the rest with ErrFull; a full inbox stores none.
func TestAppendBatchFull(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), func(c *inbox.Config) { c.MaxMessages = 4 })
	_, _ = s.Declare("box")
	appendN(t, s, "box", 0, 1)
	first, n, err := s.AppendBatch(context.Background(), "box", envs(1, 5))
	if !errors.Is(err, inbox.ErrFull) || first != 2 || n != 3 {
		t.Fatalf("AppendBatch = %d, %d, %v; want 2, 3, ErrFull", first, n, err)
	}
	if _, n, err := s.AppendBatch(context.Background(), "box", envs(9, 1)); !errors.Is(err, inbox.ErrFull) || n != 0 {
		t.Fatalf("AppendBatch on a full inbox = %d, %v; want 0, ErrFull", n, err)
	}
	msgs, _ := s.Pull(context.Background(), "box", 0, 100, 0)
	if got := fmt.Sprint(ids(msgs)); got != "[m0 m1 m2 m3]" {
		t.Fatalf("pull = %s", got)
	}
	if _, n, err := s.AppendBatch(context.Background(), "nope", envs(0, 1)); !errors.Is(err, inbox.ErrNoSuchInbox) || n != 0 {
		t.Fatalf("AppendBatch to an undeclared inbox = %d, %v", n, err)
	}
}

// TestAppendBatchWakesPull: a long poll waiting on the inbox returns the
// batch once it is committed.
func TestAppendBatchWakesPull(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), nil)
	_, _ = s.Declare("box")
	got := make(chan []*pb.Envelope, 1)
	go func() {
		msgs, _ := s.Pull(context.Background(), "box", 0, 100, 10*time.Second)
		got <- msgs
	}()
	if _, _, err := s.AppendBatch(context.Background(), "box", envs(0, 3)); err != nil {
		t.Fatal(err)
	}
	if msgs := <-got; len(msgs) == 0 || msgs[0].GetMsgId() != "m0" {
		t.Fatalf("long poll returned %v", ids(msgs))
	}
}

// BenchmarkAppendBatch is the inbox actor's drain: one caller appending
// batch messages per commit (batch=1 is what a caller of Append pays).
func BenchmarkAppendBatch(b *testing.B) {
	for _, batch := range []int{1, 16, 256, 1024} {
		b.Run(fmt.Sprint("batch=", batch), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "inbox.db")
			s := openStore(b, path, func(c *inbox.Config) { c.MaxMessages = 1 << 30 })
			_, _ = s.Declare("box")
			e := env("bench")
			e.Body, _ = anypb.New(wrapperspb.Bytes(make([]byte, 128)))
			msgs := make([]*pb.Envelope, batch)
			for i := range msgs {
				msgs[i] = e
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, _, err := s.AppendBatch(context.Background(), "box", msgs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
			if fi, err := os.Stat(path); err == nil { // the file's bytes per message held: how full its pages are
				b.ReportMetric(float64(fi.Size())/float64(b.N*batch), "file-B/msg")
			}
		})
	}
}

// An inbox's keys only grow, so a page that a commit leaves behind never
// takes another message: its pages must be packed, not split half empty
// (bbolt's default), or every commit writes, and the file keeps, twice
// the pages.
func TestQueuePagesArePacked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	s := openStore(t, path, func(c *inbox.Config) { c.MaxMessages = 1 << 20 })
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	e := env("m")
	e.Body, _ = anypb.New(wrapperspb.Bytes(make([]byte, 128)))
	msgs := make([]*pb.Envelope, 512)
	for i := range msgs {
		msgs[i] = e
	}
	for range 8 {
		if _, _, err := s.AppendBatch(context.Background(), "box", msgs); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if fill := testutil.LeafFill(t, path, "q/box"); fill < 0.8 {
		t.Fatalf("the queue's leaf pages are %.0f%% full, want at least 80%%", 100*fill)
	}
}

package outbox_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// A first-format file whose two queues hold the same sequence (each queue
// was its own bucket then) opens: the message that cannot keep its
// sequence in the one records bucket goes to the dead-letter queue, and
// every message is kept.
func TestFirstFormatSequenceInTwoQueuesOpens(t *testing.T) {
	wall := epoch0.UnixMilli()
	base := uint64(epoch0.UnixNano())
	queued := []v1Msg{
		{seq: base + 1, recipient: "a@n1", typ: "m1", firstMs: wall - 1000},
		{seq: base + 1, recipient: "b@n2", typ: "twin", firstMs: wall - 1000},
		{seq: base + 2, recipient: "b@n2", typ: "m2", firstMs: wall - 1000},
	}
	path := filepath.Join(t.TempDir(), "outbox.db")
	writeV1(t, path, queued, nil, nil, nil, base+100)
	s, err := outbox.Open(config(path, outbox.NewManualClock(epoch0), nil))
	if err != nil {
		t.Fatalf("open a first-format file with one sequence in two queues: %v", err)
	}
	defer s.Close()
	q := len(typesOfHead(t, s, "a@n1")) + len(typesOfHead(t, s, "b@n2"))
	if st := s.Stats(); q+st.DLQDepth != 3 {
		t.Fatalf("%d queued + %d dead letters, want all 3 messages kept", q, st.DLQDepth)
	}
}

func typesOfHead(t *testing.T, s *outbox.Store, r string) []string {
	t.Helper()
	msgs, _, err := s.Head(outbox.HeadRequest{Recipient: r, Max: 100})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range msgs {
		out = append(out, m.GetEnvelope().GetType())
	}
	return out
}

// A sequence above MaxSequence (ReserveSequence never gets there) is
// refused when enqueued, and leaves nothing behind: queues, restarts and
// later messages are as if it never came. (The top bit once marked
// removals in the queues' order: such a message was stored and never
// returned, and after a restart no new message was.)
func TestSequenceAboveMaxSequenceIsRefused(t *testing.T) {
	e := open(t, nil)
	for _, seq := range []uint64{outbox.MaxSequence + 1, 1<<63 | 5, math.MaxUint64} {
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: "top", Sequence: seq}}
		if _, err := e.Enqueue(context.Background(), sm); !errors.Is(err, outbox.ErrBadMessage) {
			t.Fatalf("enqueue at sequence %d: %v, want ErrBadMessage", seq, err)
		}
	}
	e.reopen(t, nil)
	e.send(t, "a@n1", "after restart")
	if got := e.types(t, "a@n1"); len(got) != 1 || got[0] != "after restart" {
		t.Fatalf("after a restart, Head returns %v, want [after restart]", got)
	}
}

// Head with Max = math.MaxInt ("everything") returns the whole queue.
func TestHeadOfEverything(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "m1", "m2")
	msgs, _, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: math.MaxInt})
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 {
		t.Fatalf("Head(Max: math.MaxInt) returned %d messages of 2 queued (Pending %d)", len(msgs), e.Pending("a@n1"))
	}
}

package node

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// TestChainRule drives the receiver's chain rule directly with the batches a
// relay would send: a failed message makes what is chained behind it refused
// unprocessed, and once its retry is accepted the next batch flows.
func TestChainRule(t *testing.T) {
	n := newLoneNode(t)

	var mu sync.Mutex
	var handled []uint64
	failOnce := map[uint64]bool{2: true}
	if _, err := n.Spawn("a", func(_ context.Context, m *Message) (proto.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		seq := m.Envelope().GetSequence()
		handled = append(handled, seq)
		if failOnce[seq] {
			delete(failOnce, seq)
			return nil, errors.New("fails once")
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	// send delivers one chained batch from peer "p" and returns the receipt codes.
	send := func(seqs ...uint64) []pb.Receipt_Code {
		t.Helper()
		envs := make([]*pb.Envelope, len(seqs))
		var prev uint64
		for i, s := range seqs {
			envs[i] = &pb.Envelope{MsgId: "m" + string(rune('0'+s)), Sender: "@p", Recipient: "a@n1",
				Sequence: s, PrevSequence: prev, Receipt: pb.Envelope_RECEIPT_PROCESSED}
			prev = s
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		codes := make([]pb.Receipt_Code, len(seqs))
		ch := make(chan struct{}, len(seqs))
		for i, e := range envs {
			n.deliverIncoming("p", e, func(rc *pb.Receipt) { codes[i] = rc.GetCode(); ch <- struct{}{} })
		}
		for range seqs {
			select {
			case <-ch:
			case <-ctx.Done():
				t.Fatal("receipts did not come")
			}
		}
		return codes
	}
	want := func(got []pb.Receipt_Code, want ...pb.Receipt_Code) {
		t.Helper()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("receipts %v, want %v", got, want)
			}
		}
	}
	// Batch [1 2]: 2 fails as the last of its batch.
	want(send(1, 2), pb.Receipt_PROCESSED, pb.Receipt_TRANSIENT)
	// Batch [2 3]: 2 succeeds on retry, so 3 (chained behind it) must run.
	want(send(2, 3), pb.Receipt_PROCESSED, pb.Receipt_PROCESSED)
	// Batch [4 5 6] with 5 failing: 6 is refused unprocessed.
	failOnce[5] = true
	want(send(4, 5, 6), pb.Receipt_PROCESSED, pb.Receipt_TRANSIENT, pb.Receipt_TRANSIENT)
	want(send(5, 6), pb.Receipt_PROCESSED, pb.Receipt_PROCESSED)
	mu.Lock()
	defer mu.Unlock()
	if got, want := handled, []uint64{1, 2, 2, 3, 4, 5, 5, 6}; !slices.Equal(got, want) {
		t.Fatalf("handled %v, want %v (6 never before 5 succeeded)", got, want)
	}
}

// newLoneNode starts a node with no peers, for tests of its receiving side.
func newLoneNode(tb testing.TB) *Node {
	tb.Helper()
	ca, err := transport.NewCA("node internal test", time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	id, err := ca.NewIdentity("n1")
	if err != nil {
		tb.Fatal(err)
	}
	cfg := DefaultConfig("n1")
	cfg.DataDir, cfg.TLS = tb.TempDir(), id
	cfg.GossipAddr, cfg.QUICAddr = "127.0.0.1:0", "127.0.0.1:0"
	n, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = n.Close() })
	return n
}

// A message refused by DropNewest gets one receipt, not one from the drop
// hook and another from the refusal.
func TestDropNewestAnswersOnce(t *testing.T) {
	n := newLoneNode(t)
	release, started := make(chan struct{}), make(chan struct{}, 1)
	if _, err := n.Spawn("busy", func(context.Context, *Message) (proto.Message, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
		return nil, nil
	}, WithMailbox(1, mailbox.DropNewest)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	receipts := map[string][]pb.Receipt_Code{}
	deliver := func(id string) {
		env := &pb.Envelope{MsgId: id, Sender: "@p", Recipient: "busy@n1", Receipt: pb.Envelope_RECEIPT_PROCESSED}
		n.deliverIncoming("p", env, func(rc *pb.Receipt) {
			mu.Lock()
			receipts[id] = append(receipts[id], rc.GetCode())
			mu.Unlock()
		})
	}
	deliver("m1")
	<-started     // m1 in the handler
	deliver("m2") // queued
	deliver("m3") // refused: the mailbox of 1 is full
	close(release)
	testutil.WaitFor(t, 5*time.Second, "receipts of m1 and m2", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(receipts["m1"]) > 0 && len(receipts["m2"]) > 0
	})
	if err := n.actor("busy").mb.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string][]pb.Receipt_Code{
		"m1": {pb.Receipt_PROCESSED}, "m2": {pb.Receipt_PROCESSED}, "m3": {pb.Receipt_CAPACITY},
	}
	for id, w := range want {
		if !slices.Equal(receipts[id], w) {
			t.Fatalf("receipts of %s = %v, want %v (all: %v)", id, receipts[id], w, receipts)
		}
	}
}

// RECEIPT_ACCEPTED asks only whether the message was queued: one ACCEPTED
// receipt, and the handler's outcome is not reported.
func TestAcceptedReceipt(t *testing.T) {
	n := newLoneNode(t)
	ran := make(chan struct{}, 1)
	if _, err := n.Spawn("a", func(context.Context, *Message) (proto.Message, error) {
		ran <- struct{}{}
		return nil, errors.New("not reported")
	}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var codes []pb.Receipt_Code
	env := &pb.Envelope{MsgId: "m1", Sender: "@p", Recipient: "a@n1", Receipt: pb.Envelope_RECEIPT_ACCEPTED}
	n.deliverIncoming("p", env, func(rc *pb.Receipt) {
		mu.Lock()
		codes = append(codes, rc.GetCode())
		mu.Unlock()
	})
	<-ran
	if err := n.actor("a").mb.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(codes, []pb.Receipt_Code{pb.Receipt_ACCEPTED}) {
		t.Fatalf("receipts %v, want exactly [ACCEPTED]", codes)
	}
}

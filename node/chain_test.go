package node

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// TestChainRule drives the receiver's chain rule directly with the batches a
// relay would send: a failed message makes what is chained behind it refused
// unprocessed, and once its retry is accepted the next batch flows.
func TestChainRule(t *testing.T) {
	ca, err := transport.NewCA("chain test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ca.NewIdentity("n1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig("n1")
	cfg.DataDir, cfg.TLS = t.TempDir(), id
	cfg.GossipAddr, cfg.QUICAddr = "127.0.0.1:0", "127.0.0.1:0"
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })

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

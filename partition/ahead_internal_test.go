package partition

import (
	"context"
	"fmt"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Reads ahead that nobody came back for within staleAheadMs give their
// places up to a new one; fresh ones keep them.
func TestStaleReadAheadGivesItsPlaceUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		age   int64
		takes bool
	}{{"fresh places kept", 0, false}, {"stale places given up", staleAheadMs + 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRelay(t, nopDeliverer{})
			sms := make([]*pb.StoredMessage, 3)
			for i := range sms {
				sms[i] = &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "f@n9", Sender: "app@n0", Type: fmt.Sprint(i)}}
			}
			for _, err := range r.Store(context.Background(), sms) {
				if err != nil {
					t.Fatal(err)
				}
			}
			head, _, err := r.store.Head(outbox.HeadRequest{Recipient: "f@n9", Max: 1})
			if err != nil || len(head) != 1 {
				t.Fatalf("head: %v %v", head, err)
			}
			done := make(chan struct{})
			close(done)
			now := r.store.ElapsedMs()
			r.ahead.m = make(map[*stream]*ahead)
			for i := range maxAhead {
				r.ahead.m[&stream{rcpt: fmt.Sprintf("s%d@n1", i)}] = &ahead{done: done, at: now - tc.age}
			}
			st := &stream{rcpt: "f@n9"}
			r.readAhead(st, outbox.HeadRequest{Recipient: "f@n9", Max: 1}, head, 0, r.store.HandedOutBelow(), r.drainSize())
			r.ahead.mu.Lock()
			_, took := r.ahead.m[st]
			r.ahead.mu.Unlock()
			if took != tc.takes {
				t.Fatalf("the new stream read ahead: %v, want %v", took, tc.takes)
			}
		})
	}
}

package mailbox_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
)

func response(id string) *pb.Envelope {
	return &pb.Envelope{MsgId: "r-" + id, Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, CorrelationId: id}}
}

func recvNow(tb testing.TB, ch <-chan *pb.Envelope) *pb.Envelope {
	tb.Helper()
	select {
	case env := <-ch:
		return env
	default:
		tb.Fatal("no response in channel")
		return nil
	}
}

func assertLen(tb testing.TB, r *mailbox.ResponseRegistry, wantW, wantB int) {
	tb.Helper()
	if w, b := r.Len(); w != wantW || b != wantB {
		tb.Fatalf("Len = (%d, %d), want (%d, %d)", w, b, wantW, wantB)
	}
}

func TestRegistryRegisterThenDeliver(t *testing.T) {
	r := mailbox.NewResponseRegistry(time.Minute)
	ch, err := r.Register("c1")
	if err != nil {
		t.Fatal(err)
	}
	assertLen(t, r, 1, 0)
	if _, err := r.Register("c1"); !errors.Is(err, mailbox.ErrDuplicateCorrelation) {
		t.Fatalf("second Register = %v, want ErrDuplicateCorrelation", err)
	}
	if !r.Deliver(response("c1")) {
		t.Fatal("Deliver = false with a waiter")
	}
	if got := recvNow(t, ch); got.GetMsgId() != "r-c1" {
		t.Fatalf("got %v", got)
	}
	assertLen(t, r, 0, 0)
	// A second response for the same id has no waiter: buffered, not blocked.
	if r.Deliver(response("c1")) {
		t.Fatal("duplicate Deliver = true")
	}
	assertLen(t, r, 0, 1)
}

func TestRegistryEarlyResponseIsBuffered(t *testing.T) {
	r := mailbox.NewResponseRegistry(time.Minute)
	if r.Deliver(response("early")) {
		t.Fatal("Deliver = true with no waiter")
	}
	assertLen(t, r, 0, 1)
	ch, err := r.Register("early")
	if err != nil {
		t.Fatal(err)
	}
	if got := recvNow(t, ch); got.GetMsgId() != "r-early" {
		t.Fatalf("got %v", got)
	}
	assertLen(t, r, 0, 0)
}

func TestRegistryBadInput(t *testing.T) {
	r := mailbox.NewResponseRegistry(0)
	if _, err := r.Register(""); !errors.Is(err, mailbox.ErrEmptyCorrelation) {
		t.Fatalf("Register(\"\") = %v", err)
	}
	for _, env := range []*pb.Envelope{nil, {}, {Rpc: &pb.RpcMeta{}}} {
		if r.Deliver(env) {
			t.Fatalf("Deliver(%v) = true", env)
		}
	}
	assertLen(t, r, 0, 0)
}

func TestRegistryCancel(t *testing.T) {
	r := mailbox.NewResponseRegistry(time.Minute)
	ch, err := r.Register("c")
	if err != nil {
		t.Fatal(err)
	}
	r.Cancel("c")
	assertLen(t, r, 0, 0)
	// The late response now has no waiter; it must not reach the old channel.
	if r.Deliver(response("c")) {
		t.Fatal("Deliver after Cancel = true")
	}
	select {
	case env := <-ch:
		t.Fatalf("cancelled waiter received %v", env)
	default:
	}
	r.Cancel("c") // drops the buffered late response too
	assertLen(t, r, 0, 0)
	if _, err := r.Register("c"); err != nil {
		t.Fatalf("Register after Cancel: %v", err)
	}
}

func TestRegistryPrune(t *testing.T) {
	const ttl = time.Minute
	r := mailbox.NewResponseRegistry(ttl)
	chans := make([]<-chan *pb.Envelope, 3)
	for i := range chans {
		ch, err := r.Register(fmt.Sprintf("w%d", i))
		if err != nil {
			t.Fatal(err)
		}
		chans[i] = ch
	}
	for i := 0; i < 4; i++ {
		r.Deliver(response(fmt.Sprintf("b%d", i)))
	}
	assertLen(t, r, 3, 4)
	tests := []struct {
		name       string
		now        time.Time
		wantPruned [2]int
		wantLeft   [2]int
	}{
		{"young entries stay", time.Now(), [2]int{0, 0}, [2]int{3, 4}},
		{"old entries go", time.Now().Add(ttl + time.Second), [2]int{3, 4}, [2]int{0, 0}},
		{"nothing left", time.Now().Add(2 * ttl), [2]int{0, 0}, [2]int{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, b := r.Prune(tt.now)
			if w != tt.wantPruned[0] || b != tt.wantPruned[1] {
				t.Fatalf("Prune = (%d, %d), want %v", w, b, tt.wantPruned)
			}
			assertLen(t, r, tt.wantLeft[0], tt.wantLeft[1])
		})
	}
	for i, ch := range chans {
		if env, ok := <-ch; ok || env != nil {
			t.Fatalf("pruned waiter %d: got (%v, %v), want closed channel", i, env, ok)
		}
	}
	// The registry still works after a prune.
	if r.Deliver(response("b0")) {
		t.Fatal("Deliver = true")
	}
	ch, err := r.Register("b0")
	if err != nil {
		t.Fatal(err)
	}
	recvNow(t, ch)
}

func TestRegistryBufferIsBounded(t *testing.T) {
	r := mailbox.NewResponseRegistry(time.Minute)
	total := 3 * mailbox.MaxBufferedResponses
	for i := 0; i < total; i++ {
		r.Deliver(response(fmt.Sprintf("x%d", i)))
	}
	_, b := r.Len()
	if b > mailbox.MaxBufferedResponses || b < mailbox.MaxBufferedResponses*9/10 {
		t.Fatalf("buffered %d, want about %d and never more", b, mailbox.MaxBufferedResponses)
	}
	// The newest survive, the oldest were evicted.
	ch, err := r.Register(fmt.Sprintf("x%d", total-1))
	if err != nil {
		t.Fatal(err)
	}
	recvNow(t, ch)
	ch, err = r.Register("x0")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case env := <-ch:
		t.Fatalf("oldest response %v survived eviction", env)
	default:
	}
}

func TestRegistryConcurrentAsks(t *testing.T) {
	r := mailbox.NewResponseRegistry(time.Minute)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				id := fmt.Sprintf("g%d-%d", g, i)
				if i%2 == 0 { // half the responses arrive early
					r.Deliver(response(id))
				}
				ch, err := r.Register(id)
				if err != nil {
					t.Error(err)
					return
				}
				if i%2 == 1 && !r.Deliver(response(id)) {
					t.Error("Deliver = false with a waiter")
					return
				}
				if env := <-ch; env.GetRpc().GetCorrelationId() != id {
					t.Errorf("got %q, want %q", env.GetRpc().GetCorrelationId(), id)
					return
				}
			}
		}()
	}
	wg.Wait()
	assertLen(t, r, 0, 0)
}

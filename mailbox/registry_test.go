package mailbox_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/types/known/anypb"
)

func response(id string) *pb.Envelope {
	return &pb.Envelope{MsgId: "r-" + id, Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, CorrelationId: id}}
}

// bigResponse is a response of about size encoded bytes.
func bigResponse(id string, size int) *pb.Envelope {
	env := response(id)
	env.Body = &anypb.Any{TypeUrl: "x", Value: make([]byte, size)}
	return env
}

func newRegistry(tb testing.TB, edit func(*mailbox.RegistryConfig)) *mailbox.ResponseRegistry {
	tb.Helper()
	cfg := mailbox.DefaultRegistryConfig()
	if edit != nil {
		edit(&cfg)
	}
	r, err := mailbox.NewResponseRegistry(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return r
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

func assertEmpty(tb testing.TB, ch <-chan *pb.Envelope) {
	tb.Helper()
	select {
	case env := <-ch:
		tb.Fatalf("unexpected response %v", env)
	default:
	}
}

func assertLen(tb testing.TB, r *mailbox.ResponseRegistry, wantW, wantB int) {
	tb.Helper()
	if w, b := r.Len(); w != wantW || b != wantB {
		tb.Fatalf("Len = (%d, %d), want (%d, %d)", w, b, wantW, wantB)
	}
}

func TestRegistryRegisterThenDeliver(t *testing.T) {
	r := newRegistry(t, nil)
	ch, err := r.Register("c1", "n2")
	if err != nil {
		t.Fatal(err)
	}
	assertLen(t, r, 1, 0)
	if _, err := r.Register("c1", "n2"); !errors.Is(err, mailbox.ErrDuplicateCorrelation) {
		t.Fatalf("second Register = %v, want ErrDuplicateCorrelation", err)
	}
	if !r.Deliver("n2", response("c1")) {
		t.Fatal("Deliver = false with a waiter")
	}
	if got := recvNow(t, ch); got.GetMsgId() != "r-c1" {
		t.Fatalf("got %v", got)
	}
	assertLen(t, r, 0, 0)
	// A second response for the same id has no waiter: buffered, not blocked.
	if r.Deliver("n2", response("c1")) {
		t.Fatal("duplicate Deliver = true")
	}
	assertLen(t, r, 0, 1)
}

// TestRegistryChannelOfTheCaller: RegisterChan takes the caller's
// channel, which after its response can wait for the next; a channel that
// could block Deliver is refused, and one that filled up meanwhile never
// blocks it.
func TestRegistryChannelOfTheCaller(t *testing.T) {
	r := newRegistry(t, nil)
	ch := make(chan *pb.Envelope, 1)
	for _, id := range []string{"c1", "c2"} {
		if err := r.RegisterChan(id, "n2", ch); err != nil {
			t.Fatal(err)
		}
		if !r.Deliver("n2", response(id)) {
			t.Fatalf("Deliver %s = false with a waiter", id)
		}
		if got := recvNow(t, ch); got.GetMsgId() != "r-"+id {
			t.Fatalf("got %v, want the response to %s", got, id)
		}
	}
	assertLen(t, r, 0, 0)
	if err := r.RegisterChan("c3", "n2", make(chan *pb.Envelope)); err == nil {
		t.Fatal("an unbuffered channel was taken: Deliver would block")
	}
	full := make(chan *pb.Envelope, 1)
	full <- response("other")
	if err := r.RegisterChan("c3", "n2", full); err == nil {
		t.Fatal("a channel holding a response was taken")
	}
	// Filled by the caller after registering: Deliver drops, never blocks.
	ch2 := make(chan *pb.Envelope, 1)
	if err := r.RegisterChan("c4", "n2", ch2); err != nil {
		t.Fatal(err)
	}
	ch2 <- response("other")
	if r.Deliver("n2", response("c4")) {
		t.Fatal("Deliver into a full channel = true")
	}
	if st := r.Stats(); st.Dropped != 1 {
		t.Fatalf("stats %+v, want the response counted as dropped", st)
	}
}

// TestRegistryOnlyTheAskedPeerAnswers: a response from any other peer
// than the one the waiter named is refused, and does not use up the
// waiter: the real answer still gets through.
func TestRegistryOnlyTheAskedPeerAnswers(t *testing.T) {
	r := newRegistry(t, nil)
	ch, err := r.Register("c1", "n2")
	if err != nil {
		t.Fatal(err)
	}
	forged := response("c1")
	forged.MsgId = "forged"
	for _, from := range []string{"mallory", "", "n1"} {
		if r.Deliver(from, forged) {
			t.Fatalf("Deliver from %q = true", from)
		}
	}
	assertEmpty(t, ch)
	if st := r.Stats(); st.Refused != 3 || st.Early != 0 {
		t.Fatalf("stats %+v, want 3 refused and nothing buffered", st)
	}
	if !r.Deliver("n2", response("c1")) {
		t.Fatal("the asked peer's response was not delivered")
	}
	if got := recvNow(t, ch); got.GetMsgId() != "r-c1" {
		t.Fatalf("got %v", got)
	}
}

func TestRegistryEarlyResponseIsBuffered(t *testing.T) {
	r := newRegistry(t, nil)
	if r.Deliver("n2", response("early")) {
		t.Fatal("Deliver = true with no waiter")
	}
	assertLen(t, r, 0, 1)
	// Another peer's early response is not handed to a waiter for n3.
	ch, err := r.Register("early", "n3")
	if err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, ch)
	r.Cancel("early")
	ch, err = r.Register("early", "n2")
	if err != nil {
		t.Fatal(err)
	}
	if got := recvNow(t, ch); got.GetMsgId() != "r-early" {
		t.Fatalf("got %v", got)
	}
	assertLen(t, r, 0, 0)
}

func TestRegistryBadInput(t *testing.T) {
	r := newRegistry(t, nil)
	if _, err := r.Register("", "n2"); !errors.Is(err, mailbox.ErrEmptyCorrelation) {
		t.Fatalf("Register(\"\") = %v", err)
	}
	for _, env := range []*pb.Envelope{nil, {}, {Rpc: &pb.RpcMeta{}}} {
		if r.Deliver("n2", env) {
			t.Fatalf("Deliver(%v) = true", env)
		}
	}
	assertLen(t, r, 0, 0)
	for _, edit := range []func(*mailbox.RegistryConfig){
		func(c *mailbox.RegistryConfig) { c.TTL = 0 },
		func(c *mailbox.RegistryConfig) { c.EarlyTTL = -1 },
		func(c *mailbox.RegistryConfig) { c.EarlyBytesPerPeer = -1 },
		func(c *mailbox.RegistryConfig) { c.EarlyBytes = c.EarlyBytesPerPeer - 1 },
	} {
		cfg := mailbox.DefaultRegistryConfig()
		edit(&cfg)
		if _, err := mailbox.NewResponseRegistry(cfg); !errors.Is(err, mailbox.ErrBadConfig) {
			t.Fatalf("NewResponseRegistry(%+v) = %v, want ErrBadConfig", cfg, err)
		}
	}
}

func TestRegistryCancel(t *testing.T) {
	r := newRegistry(t, nil)
	ch, err := r.Register("c", "n2")
	if err != nil {
		t.Fatal(err)
	}
	r.Cancel("c")
	assertLen(t, r, 0, 0)
	// The late response now has no waiter; it must not reach the old channel.
	if r.Deliver("n2", response("c")) {
		t.Fatal("Deliver after Cancel = true")
	}
	assertEmpty(t, ch)
	if r.ForgetPeer("n2") != 1 {
		t.Fatal("ForgetPeer did not drop the late response")
	}
	assertLen(t, r, 0, 0)
	if _, err := r.Register("c", "n2"); err != nil {
		t.Fatalf("Register after Cancel: %v", err)
	}
}

func TestRegistryPrune(t *testing.T) {
	r := newRegistry(t, func(c *mailbox.RegistryConfig) { c.TTL, c.EarlyTTL = time.Minute, 5*time.Second })
	chans := make([]<-chan *pb.Envelope, 3)
	for i := range chans {
		ch, err := r.Register(fmt.Sprintf("w%d", i), "n2")
		if err != nil {
			t.Fatal(err)
		}
		chans[i] = ch
	}
	for i := 0; i < 4; i++ {
		r.Deliver("n2", response(fmt.Sprintf("b%d", i)))
	}
	assertLen(t, r, 3, 4)
	tests := []struct {
		name       string
		now        time.Time
		wantPruned [2]int
		wantLeft   [2]int
	}{
		{"young entries stay", time.Now(), [2]int{0, 0}, [2]int{3, 4}},
		{"early responses go after EarlyTTL", time.Now().Add(6 * time.Second), [2]int{0, 4}, [2]int{3, 0}},
		{"waiters go after TTL", time.Now().Add(time.Minute + time.Second), [2]int{3, 0}, [2]int{0, 0}},
		{"nothing left", time.Now().Add(2 * time.Minute), [2]int{0, 0}, [2]int{0, 0}},
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
	if r.Deliver("n2", response("b0")) {
		t.Fatal("Deliver = true")
	}
	ch, err := r.Register("b0", "n2")
	if err != nil {
		t.Fatal(err)
	}
	recvNow(t, ch)
}

// TestRegistryEarlyBufferBoundedByBytes: unsolicited responses, however
// many and however large, are held within the per-peer and total bounds,
// charged to the peer that sent them; a peer's flood evicts its own
// responses first, and the total bound evicts from the largest holder.
func TestRegistryEarlyBufferBoundedByBytes(t *testing.T) {
	const perPeer, total = 64 << 10, 160 << 10
	r := newRegistry(t, func(c *mailbox.RegistryConfig) { c.EarlyBytesPerPeer, c.EarlyBytes = perPeer, total })
	// A response larger than a peer's share is never kept.
	if r.Deliver("mallory", bigResponse("huge", 4<<20)); r.Stats().Early != 0 {
		t.Fatal("a 4 MiB response was buffered")
	}
	r.Deliver("n2", bigResponse("n2-0", 1000))
	for i := 0; i < 2000; i++ {
		r.Deliver("mallory", bigResponse(fmt.Sprintf("m%d", i), 1000))
		if st := r.Stats(); st.EarlyBytes > total {
			t.Fatalf("after %d responses: %d bytes buffered, bound %d", i+1, st.EarlyBytes, total)
		}
	}
	st := r.Stats()
	if st.EarlyBytes > total || st.Early > perPeer/1000+2 {
		t.Fatalf("stats %+v over the bounds", st)
	}
	// n2's one response survived mallory's flood.
	ch, err := r.Register("n2-0", "n2")
	if err != nil {
		t.Fatal(err)
	}
	recvNow(t, ch)
	// Many peers together stay under the total: the largest holder pays.
	for p := 0; p < 10; p++ {
		for i := 0; i < 100; i++ {
			r.Deliver(fmt.Sprintf("p%d", p), bigResponse(fmt.Sprintf("p%d-%d", p, i), 1000))
		}
	}
	if st := r.Stats(); st.EarlyBytes > total {
		t.Fatalf("%d bytes buffered from 10 peers, bound %d", st.EarlyBytes, total)
	}
	// Leaving drops everything a peer had buffered.
	r.ForgetPeer("mallory")
	for p := 0; p < 10; p++ {
		r.ForgetPeer(fmt.Sprintf("p%d", p))
	}
	if st := r.Stats(); st.Early != 0 || st.EarlyBytes != 0 {
		t.Fatalf("after every peer left: %+v", st)
	}
	if st := r.Stats(); st.Dropped == 0 {
		t.Fatal("nothing counted as dropped")
	}
}

func TestRegistryKeepsNoneWithZeroBudget(t *testing.T) {
	r := newRegistry(t, func(c *mailbox.RegistryConfig) { c.EarlyBytesPerPeer = 0 })
	r.Deliver("n2", response("x"))
	if st := r.Stats(); st.Early != 0 || st.Dropped != 1 {
		t.Fatalf("stats %+v, want nothing kept and one dropped", st)
	}
}

func TestRegistryConcurrentAsks(t *testing.T) {
	r := newRegistry(t, nil)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			peer := fmt.Sprintf("n%d", g%3)
			for i := 0; i < 500; i++ {
				id := fmt.Sprintf("g%d-%d", g, i)
				if i%2 == 0 { // half the responses arrive early
					r.Deliver(peer, response(id))
				}
				if i%7 == 0 { // and some forged ones from elsewhere
					r.Deliver("mallory", response(id))
				}
				ch, err := r.Register(id, peer)
				if err != nil {
					t.Error(err)
					return
				}
				if i%2 == 1 && !r.Deliver(peer, response(id)) {
					t.Error("Deliver = false with a waiter")
					return
				}
				if env := <-ch; env.GetRpc().GetCorrelationId() != id || !strings.HasPrefix(env.GetMsgId(), "r-") {
					t.Errorf("got %v, want the response to %q", env, id)
					return
				}
			}
		}()
	}
	wg.Wait()
	r.ForgetPeer("mallory")
	assertLen(t, r, 0, 0)
}

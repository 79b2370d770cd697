package partition

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// b3Deliverer answers every message PROCESSED, except: the first emission
// of capFirst is answered CAPACITY (retry after capRetry), and an emission
// of gate waits in Deliver until gateOut is closed (gateIn is closed when
// it arrives).
type b3Deliverer struct {
	capFirst string
	capRetry time.Duration
	gate     string
	gateIn   chan struct{}
	gateOut  chan struct{}
	inOnce   sync.Once

	// mu guards the fields below.
	mu    sync.Mutex
	calls map[string]int
	ran   map[string]int
}

func (d *b3Deliverer) Alive(string) bool { return true }

func (d *b3Deliverer) Deliver(ctx context.Context, _ string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	rcpt := envs[0].GetRecipient()
	d.mu.Lock()
	d.calls[rcpt]++
	n := d.calls[rcpt]
	d.mu.Unlock()
	if rcpt == d.gate {
		d.inOnce.Do(func() { close(d.gateIn) })
		select {
		case <-d.gateOut:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	rcs := make([]*pb.Receipt, len(envs))
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, e := range envs {
		if rcpt == d.capFirst && n == 1 {
			rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_CAPACITY, RetryAfterMs: d.capRetry.Milliseconds(), Message: "full"}
			continue
		}
		d.ran[rcpt]++
		rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: e.GetSequence()}
	}
	return rcs, nil
}

func (d *b3Deliverer) ranCount(rcpt string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ran[rcpt]
}

func (d *b3Deliverer) callCount(rcpt string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[rcpt]
}

// b3Stacks returns the goroutine dump, one goroutine per element.
func b3Stacks() []string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		out = append(out, string(g))
	}
	return out
}

// b3Quiet reports that no emission goroutine is running and every loop is
// parked in its select with no wake-up pending.
func (r *Relay) b3Quiet() bool {
	for _, p := range r.parts {
		if len(p.wake) != 0 {
			return false
		}
	}
	loops := 0
	for _, g := range b3Stacks() {
		if strings.Contains(g, "partition.(*Relay).deliver(") {
			return false
		}
		if strings.Contains(g, "partition.(*Relay).loop(") {
			if !strings.Contains(g, " [select") {
				return false
			}
			loops++
		}
	}
	return loops == len(r.parts)
}

// b3Relay returns a relay with 2 partitions, n2's AIMD limit starting at
// one slot, over a real store and a b3Deliverer that refuses x's first
// emission for capacity and holds y's in Deliver until its gate opens.
// The relay is not started; cleanup closes it and its store.
func b3Relay(t *testing.T) (x, y string, r *Relay, d *b3Deliverer) {
	t.Helper()
	const parts = 2
	x, y = b3Names("n2", parts)
	d = &b3Deliverer{capFirst: x, capRetry: time.Second, gate: y,
		gateIn: make(chan struct{}), gateOut: make(chan struct{}),
		calls: map[string]int{}, ran: map[string]int{}}
	scfg := outbox.DefaultConfig(filepath.Join(t.TempDir(), "outbox.db"))
	scfg.Logger = slog.New(slog.DiscardHandler)
	s, err := outbox.Open(scfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Partitions = parts
	cfg.Logger = scfg.Logger
	cfg.Limiter = LimiterConfig{Initial: 1, Min: 1, Max: 1024}
	cfg.DirectTimeout = time.Minute // the gated attempt must not time out
	r, err = New(cfg, s, d)
	if err != nil {
		_ = s.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Close()
		_ = s.Close()
	})
	return x, y, r, d
}

// b3SendDirect starts a direct Send to rcpt; the returned func waits for
// it and fails t unless it was Delivered.
func (r *Relay) b3SendDirect(rcpt string) func(t *testing.T) {
	type result struct {
		res Sent
		err error
	}
	sent := make(chan result, 1)
	go func() {
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: rcpt, Sender: "app@n0", Type: "y", MsgId: "y"}}
		res, err := r.Send(context.Background(), sm, true)
		sent <- result{res, err}
	}()
	return func(t *testing.T) {
		t.Helper()
		select {
		case got := <-sent:
			if got.err != nil || got.res.Outcome != Delivered {
				t.Fatalf("direct Send to %s: %+v, %v", rcpt, got.res, got.err)
			}
		case <-time.After(wait10s):
			t.Fatalf("direct Send to %s did not return", rcpt)
		}
	}
}

// b3WaitRan waits until x ran once and left the store; on a timeout it
// says where the relay stood.
func (r *Relay) b3WaitRan(t *testing.T, d *b3Deliverer, x string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.store.Pending(x) != 0 || d.ranCount(x) != 1 {
		if time.Now().After(deadline) {
			lim := r.Limiter("n2")
			t.Fatalf("%s stalled: pending %d, ran %d, Deliver calls %d; n2 limiter %d/%d in flight, %d nodes excluded, %d loop iterations: a message queued to a live peer with free slots is never sent",
				x, r.store.Pending(x), d.ranCount(x), d.callCount(x), lim.InFlight(), lim.Limit(), r.store.ExcludedNodes(), r.iterations.Load())
		}
		time.Sleep(20 * time.Millisecond) // polling interval; the condition decides
	}
}

// b3Names returns two recipients of node in different partitions of n.
func b3Names(node string, n int) (a, b string) {
	a = "x@" + node
	for i := 0; ; i++ {
		b = fmt.Sprintf("y%d@%s", i, node)
		if PartitionOf(b, n) != PartitionOf(a, n) {
			return a, b
		}
	}
}

// A direct attempt's slot is released without waking the loops unless
// the release brought its node back into the scans (scan.go release). A
// loop whose scan saw the node full skips its recipients (keep returns
// false, so their send_at is not even its next timer) and relies on the
// exclusion made after the scan to be undone, with a wake-up, by the
// release. But when the direct attempt's l.Release lands between the
// scan's keep and the exclude's re-check, the re-check finds a free slot
// and excludes nothing, and the release finds nothing to include: unless
// the release wakes the loops, the loop sleeps with no timer and the
// recipient, queued to a live peer with its slot free, is never sent. It
// must be sent.
//
// The interleaving is forced by holding xmu (only timing changes): the
// loop's scan reaches exclude while Send's direct attempt holds the one
// slot, then the attempt's release runs its l.Release and waits for xmu.
func TestDirectSendsReleaseWakesTheLoop(t *testing.T) {
	x, y, r, d := b3Relay(t)
	var closeOnce sync.Once
	t.Cleanup(func() { closeOnce.Do(func() { close(d.gateOut) }) })
	r.Start()

	// x's first emission is refused for capacity: x is deferred by the
	// receiver's hint (1 s) and its loop sleeps with a timer for it.
	storeOne(t, r, x)
	testutil.WaitFor(t, wait10s, "x deferred after its CAPACITY receipt", func() bool { return r.deferred.Load() >= 1 })
	testutil.WaitFor(t, wait10s, "the relay quiet (loops parked, nothing pending)", r.b3Quiet)

	r.xmu.Lock()
	locked := true
	defer func() {
		if locked {
			r.xmu.Unlock()
		}
	}()
	// A direct Send to y (same node, other partition) takes n2's only slot.
	sent := r.b3SendDirect(y)
	select {
	case <-d.gateIn:
	case <-time.After(wait10s):
		t.Fatal("the direct attempt to y never reached Deliver")
	}
	// x comes due; the loop's scan finds n2 full and goes to exclude it.
	waitBlocked(t, "partition.(*Relay).exclude(", nil)
	// The direct attempt ends: its l.Release runs, then it waits for xmu.
	closeOnce.Do(func() { close(d.gateOut) })
	waitBlocked(t, "partition.(*Relay).release(", nil)
	r.xmu.Unlock()
	locked = false
	sent(t)

	// n2 now has its slot free and is not excluded; x is queued and due.
	r.b3WaitRan(t, d, x)
}

// The same missing wake-up through dispatch: a loop whose scan kept x
// (n2 had a free slot) but whose dispatch then finds the slot taken by a
// direct Send (TryAcquire returns 0) returns false without excluding n2
// and without a timer for x (stream.go dispatch). n2 was never excluded
// and Send notifies only its own recipient's partition, so unless the
// direct attempt's release wakes the loops, x, queued to a live peer with
// its slot free, is never sent. It must be sent. The window
// (from the scan to TryAcquire) is held open with the afterLookup hook,
// which runs in dispatch's lockStream.
func TestDispatchThatLosesItsSlotToADirectSendIsRetried(t *testing.T) {
	x, y, r, d := b3Relay(t)
	var armed atomic.Bool
	var hookOnce sync.Once
	hookIn, hookOut := make(chan struct{}), make(chan struct{})
	r.afterLookup = func(rcpt string) {
		if rcpt != x || !armed.Load() {
			return
		}
		hookOnce.Do(func() {
			close(hookIn)
			<-hookOut
		})
	}
	var gateOnce, hookOutOnce sync.Once
	t.Cleanup(func() {
		hookOutOnce.Do(func() { close(hookOut) })
		gateOnce.Do(func() { close(d.gateOut) })
	})
	r.Start()

	storeOne(t, r, x)
	testutil.WaitFor(t, wait10s, "x deferred after its CAPACITY receipt", func() bool { return r.deferred.Load() >= 1 })
	testutil.WaitFor(t, wait10s, "the relay quiet (loops parked, nothing pending)", r.b3Quiet)
	armed.Store(true)

	// x comes due (its loop's timer); the scan keeps it and dispatch looks
	// its stream up: held there.
	select {
	case <-hookIn:
	case <-time.After(wait10s):
		t.Fatal("the loop never dispatched x")
	}
	// Meanwhile a direct Send to y (same node, other partition) takes n2's
	// only slot.
	sent := r.b3SendDirect(y)
	select {
	case <-d.gateIn:
	case <-time.After(wait10s):
		t.Fatal("the direct attempt to y never reached Deliver")
	}
	// dispatch goes on: TryAcquire finds n2 full and returns false.
	hookOutOnce.Do(func() { close(hookOut) })
	testutil.WaitFor(t, wait10s, "x's dispatch done and the loops parked", func() bool {
		for _, g := range b3Stacks() {
			if strings.Contains(g, "partition.(*Relay).dispatch(") {
				return false
			}
		}
		for _, g := range b3Stacks() {
			if strings.Contains(g, "partition.(*Relay).loop(") && !strings.Contains(g, " [select") {
				return false
			}
		}
		return true
	})
	// The direct attempt ends and frees the slot.
	gateOnce.Do(func() { close(d.gateOut) })
	sent(t)

	r.b3WaitRan(t, d, x)
}

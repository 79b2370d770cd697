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
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// nopDeliverer answers every message PROCESSED.
type nopDeliverer struct{}

func (nopDeliverer) Alive(string) bool { return true }
func (nopDeliverer) Deliver(_ context.Context, _ string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	rcs := make([]*pb.Receipt, len(envs))
	for i, e := range envs {
		rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED}
	}
	return rcs, nil
}

func newTestRelay(tb testing.TB, d Deliverer) *Relay { return newTestRelayWith(tb, d, nil) }

// newTestRelayWith is newTestRelay with smut applied to the store's config.
func newTestRelayWith(tb testing.TB, d Deliverer, smut func(*outbox.Config)) *Relay {
	r, _ := newTestRelayConfig(tb, d, smut, nil)
	return r
}

// newTestRelayConfig is newTestRelayWith with rmut applied to the relay's
// config too (one partition unless it says otherwise); it also returns
// the store's path.
func newTestRelayConfig(tb testing.TB, d Deliverer, smut func(*outbox.Config), rmut func(*Config)) (*Relay, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "outbox.db")
	scfg := outbox.DefaultConfig(path)
	scfg.Logger = slog.New(slog.DiscardHandler)
	if smut != nil {
		smut(&scfg)
	}
	s, err := outbox.Open(scfg)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Partitions = 1
	cfg.Logger = scfg.Logger
	if rmut != nil {
		rmut(&cfg)
	}
	r, err := New(cfg, s, d)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = r.Close()
		_ = s.Close()
	})
	return r, path
}

// waitBlocked waits until some goroutine is blocked on a lock with fn on
// its stack, or done is closed (it did not have to wait). It reads the
// goroutine dump: the only way to know that a goroutine is waiting, not
// just about to.
func waitBlocked(tb testing.TB, fn string, done <-chan struct{}) {
	tb.Helper()
	testutil.WaitFor(tb, 10*time.Second, "a goroutine blocked in "+fn, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range bytes.Split(buf, []byte("\n\n")) {
			s := string(g)
			if strings.Contains(s, fn) && (strings.Contains(s, "sync.(*Mutex).Lock") || strings.Contains(s, "sync.(*RWMutex)")) {
				return true
			}
		}
		return false
	})
}

// The relay's locks are taken in one order everywhere: a stream's mutex
// before the store's, and the store's before a partition's (the loop's
// keep filter runs under the store's read lock and looks the stream up).
// forget once took the partition's mutex before the stream's, which closes
// a cycle: a Send holding the stream asks the store (Pending), a store
// writer waits for the loop's read lock, the loop waits for the partition
// held by forget, and forget waits for the stream. Here each of the four
// is put in place in that order, as the scheduler may; Send's call must
// still return.
func TestLockOrderForgetSendLoop(t *testing.T) {
	r := newTestRelay(t, nopDeliverer{})
	ctx := context.Background()
	// A queue in the partition, so the loop's filter has work.
	if _, err := r.Send(ctx, &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "other@n1"}}, false); err != nil {
		t.Fatal(err)
	}
	st, err := r.stream("a@n1") // idle: forget may drop it
	if err != nil {
		t.Fatal(err)
	}
	p := r.part("a@n1")

	st.mu.Lock() // Send: holds the stream...
	forgot := make(chan struct{})
	go func() { r.forget(st); close(forgot) }()
	waitBlocked(t, "partition.(*Relay).forget", forgot)
	inKeep := make(chan struct{})
	var once sync.Once
	go r.store.DueRecipients(r.store.ElapsedMs()+1e9, func(rc string) bool {
		once.Do(func() { close(inKeep) })
		return p.lookup(rc) == nil // the loop's filter, under the store's read lock
	}, 10)
	<-inKeep
	woke := make(chan struct{})
	go func() { r.store.WakeNode("n9"); close(woke) }() // a store writer
	waitBlocked(t, "outbox.(*Store).WakeNode", woke)
	asked := make(chan struct{})
	go func() {
		r.store.Pending("a@n1") // ...and asks the store, as Send and dispatch do
		close(asked)
	}()
	select {
	case <-asked:
	case <-time.After(5 * time.Second):
		t.Fatal("deadlock: forget holds the partition while waiting for the stream")
	}
	st.mu.Unlock()
	<-forgot
	<-woke
}

// gatedDeliverer holds every Deliver until gate is closed and records how
// many were out at once.
type gatedDeliverer struct {
	gate chan struct{}
	// mu guards the fields below.
	mu         sync.Mutex
	calls, out int
	maxOut     int
}

func (d *gatedDeliverer) Alive(string) bool { return true }
func (d *gatedDeliverer) Deliver(ctx context.Context, node string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	d.mu.Lock()
	d.calls++
	d.out++
	d.maxOut = max(d.maxOut, d.out)
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.out--
		d.mu.Unlock()
	}()
	select {
	case <-d.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nopDeliverer{}.Deliver(ctx, node, envs)
}

func (d *gatedDeliverer) count() (calls, maxOut int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls, d.maxOut
}

// A stream forgotten between a caller finding it and locking it (an
// emission ended and found it idle) must not be used: a second stream
// object for the same recipient would let two direct attempts, or a
// direct attempt and an emission, go out at once and run out of order.
func TestForgottenStreamIsNotUsed(t *testing.T) {
	d := &gatedDeliverer{gate: make(chan struct{})}
	r := newTestRelay(t, d)
	st, err := r.stream("a@n1") // in memory and idle, as after an emission
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	r.afterLookup = func(string) { once.Do(func() { r.forget(st) }) }
	r.Start()
	ctx := context.Background()
	first := make(chan Sent, 1)
	go func() {
		res, err := r.Send(ctx, &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "m0"}}, true)
		if err != nil {
			t.Error(err)
		}
		first <- res
	}()
	testutil.WaitFor(t, 10*time.Second, "direct attempt out", func() bool { c, _ := d.count(); return c == 1 })
	res, err := r.Send(ctx, &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "m1"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	_, maxOut := d.count()
	close(d.gate)
	if res.Outcome != Queued || maxOut != 1 {
		t.Fatalf("second send %v with %d attempts out at once: the first used a forgotten stream", res.Outcome, maxOut)
	}
	if res := <-first; res.Outcome != Delivered {
		t.Fatalf("first send %+v", res)
	}
}

// streamsInMemory counts the streams the relay holds.
func (r *Relay) streamsInMemory() int {
	n := 0
	for _, p := range r.parts {
		p.mu.Lock()
		n += len(p.streams)
		p.mu.Unlock()
	}
	return n
}

// A stream is kept in memory only while something of it is unresolved:
// a node sending directly to many actors, one message each, does not
// accumulate one stream object per actor ever addressed.
func TestDirectSendsDoNotAccumulateStreams(t *testing.T) {
	r := newTestRelay(t, nopDeliverer{})
	r.Start()
	for i := range 200 {
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: fmt.Sprintf("actor%d@n1", i)}}
		if res, err := r.Send(context.Background(), sm, true); err != nil || res.Outcome != Delivered {
			t.Fatalf("send %d: %+v %v", i, res, err)
		}
	}
	if n := r.streamsInMemory(); n != 0 {
		t.Fatalf("%d streams in memory after 200 settled direct sends", n)
	}
}

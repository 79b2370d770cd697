package partition_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

// blockUntilCancelled holds every emission until its context ends.
func blockUntilCancelled(ctx context.Context, _ int, _ []*pb.Envelope) ([]*pb.Receipt, error, bool) {
	<-ctx.Done()
	return nil, ctx.Err(), true
}

// Close cancels emissions in flight and waits for them; their messages
// stay queued with nothing recorded against them.
func TestCloseCancelsInFlightEmissions(t *testing.T) {
	rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 1 }, func(c *partition.Config) { c.DeliverTimeout = time.Hour })
	rg.fake.set(func(f *fake) { f.intercept = blockUntilCancelled })
	rg.queue(t, "a@n1", "m0", "m1")
	rg.queue(t, "b@n2", "x")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "emissions out", func() bool { return rg.fake.callCount() == 2 })
	closed := make(chan struct{})
	go func() { _ = rg.relay.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(wait):
		t.Fatal("Close did not cancel the emissions in flight")
	}
	for _, r := range []string{"a@n1", "b@n2"} {
		msgs, _, err := rg.store.Head(outbox.HeadRequest{Recipient: r, Max: 10})
		if err != nil || len(msgs) == 0 {
			t.Fatalf("%s: %v %v", r, msgs, err)
		}
		for _, m := range msgs {
			if m.GetAttempts() != 0 || m.GetLastError() != "" {
				t.Fatalf("%s: failure recorded on close: %+v", r, m)
			}
		}
	}
	due, _ := rg.store.DueRecipients(rg.store.ElapsedMs(), nil, 10)
	if len(due) != 2 {
		t.Fatalf("due after close %v: a queue was deferred", due)
	}
	if st := rg.store.Stats(); st.DLQDepth != 0 || st.Retries != 0 {
		t.Fatalf("store stats %+v", st)
	}
	if err := rg.relay.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// The sweeper gives up messages whose TTL ran out while their peer is
// down, when no emission reads the queue.
func TestSweeperExpiresWhilePeerDown(t *testing.T) {
	rg := newRig(t, func(c *outbox.Config) { c.MaxClockSkew = 0 }, func(c *partition.Config) { c.DownRecheck = time.Hour })
	rg.fake.set(func(f *fake) { f.down["n1"] = true })
	sm := rg.msg("a@n1", "short")
	sm.Envelope.TtlMs = 100
	if _, err := rg.relay.Send(context.Background(), sm, false); err != nil {
		t.Fatal(err)
	}
	rg.queue(t, "a@n1", "long")
	rg.relay.Start()
	testutil.WaitFor(t, wait, "expired by the sweeper", func() bool { return rg.store.Stats().Expired == 1 })
	dl, _ := rg.store.DeadLetters(outbox.DLQFilter{})
	if len(dl) != 1 || dl[0].Message.GetEnvelope().GetType() != "short" {
		t.Fatalf("dead letters %+v", dl)
	}
	if rg.fake.callCount() != 0 || rg.store.Pending("a@n1") != 1 {
		t.Fatalf("calls %d pending %d", rg.fake.callCount(), rg.store.Pending("a@n1"))
	}
}

// Many callers sending to few streams, with direct attempts, lost
// receipts and handler failures mixed in: every message accepted by Send
// runs exactly once, in the order of its sequence, and no stream ever has
// two emissions out at once.
func TestConcurrentSendsKeepStreamsExact(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
	var seed atomic.Uint64
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			r := rand.New(rand.NewPCG(seed.Add(1), 7))
			if r.IntN(8) != 0 {
				return nil, nil, false
			}
			f.mu.Lock()
			for _, e := range envs[:r.IntN(len(envs)+1)] {
				f.receive(e) // some run, then the connection drops
			}
			f.mu.Unlock()
			return nil, errUnreachable, true
		}
	})
	rg.relay.Start()
	rcpts := []string{"a@n1", "b@n1"}
	const callers, each = 6, 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := map[string][]string{}
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				r := rcpts[(c+i)%len(rcpts)]
				typ := fmt.Sprintf("c%d-%03d", c, i)
				res, err := rg.relay.Send(context.Background(), rg.msg(r, typ), i%3 != 0)
				if err != nil || (res.Outcome != partition.Delivered && res.Outcome != partition.Queued) {
					t.Errorf("send %s: %+v %v", typ, res, err)
					return
				}
				mu.Lock()
				accepted[r] = append(accepted[r], typ)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	testutil.WaitFor(t, 3*wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	for _, r := range rcpts {
		got := rg.fake.ranTypes(r)
		want := accepted[r]
		slices.Sort(want)
		sorted := slices.Clone(got)
		slices.Sort(sorted)
		if !slices.Equal(sorted, want) {
			t.Fatalf("%s: %d ran, %d accepted; ran once each: %v", r, len(got), len(want), slices.Equal(slices.Compact(slices.Clone(sorted)), sorted))
		}
	}
	rg.fake.mu.Lock()
	defer rg.fake.mu.Unlock()
	for _, r := range rcpts {
		if m := rg.fake.maxFlight[r]; m != 1 {
			t.Fatalf("%s had %d emissions out at once", r, m)
		}
		var last uint64
		for _, e := range rg.fake.ran[r] {
			if e.GetStreamEpoch() == 0 && e.GetSequence() <= last {
				t.Fatalf("%s ran sequence %d after %d", r, e.GetSequence(), last)
			}
			last = e.GetSequence()
		}
	}
}

// A direct attempt is an emission too: Close cancels it, and Send stores
// its message (uncounted) instead of holding the caller for
// DirectTimeout.
func TestCloseCancelsDirectAttempt(t *testing.T) {
	rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 1 }, func(c *partition.Config) { c.DirectTimeout = time.Minute })
	rg.fake.set(func(f *fake) { f.intercept = blockUntilCancelled })
	rg.relay.Start()
	type result struct {
		res partition.Sent
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := rg.relay.Send(context.Background(), rg.msg("a@n1", "x"), true)
		done <- result{res, err}
	}()
	testutil.WaitFor(t, wait, "direct attempt out", func() bool { return rg.fake.callCount() == 1 })
	_ = rg.relay.Close()
	var r result
	select {
	case r = <-done:
	case <-time.After(wait):
		t.Fatal("Close did not cancel the direct attempt: Send still waits")
	}
	if r.err != nil || r.res.Outcome != partition.Queued {
		t.Fatalf("send: %+v %v, want Queued", r.res, r.err)
	}
	msgs, _, _ := rg.store.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 1})
	if len(msgs) != 1 || msgs[0].GetAttempts() != 0 {
		t.Fatalf("stored %+v, want the message, uncounted", msgs)
	}
}

// Replay takes its sequences from the relay, so a replayed message is
// registered as storing like Send's: while it commits, a later Send of the
// stream is not attempted directly, a higher sequence already stored is
// not emitted ahead of it, and the relay does not spin meanwhile.
func TestReplayThroughTheRelaysSequencer(t *testing.T) {
	rg := newRig(t, nil, nil)
	old := rg.msg("a@n1", "replayed")
	seq, err := rg.store.ReserveSequence()
	if err != nil {
		t.Fatal(err)
	}
	old.Envelope.Sequence = seq
	if err := rg.store.DeadLetter(context.Background(), old, "rejected: earlier"); err != nil {
		t.Fatal(err)
	}
	rg.relay.Start()
	h := &heldSequencer{relay: rg.relay, reserved: make(chan uint64, 1), proceed: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(h.proceed) }) }
	t.Cleanup(release)
	rg.store.SetSequencer(h)
	replayed := make(chan error, 1)
	go func() {
		_, err := rg.store.Replay(outbox.DLQFilter{Recipient: "a@n1"})
		replayed <- err
	}()
	var n uint64
	select {
	case n = <-h.reserved:
	case <-time.After(wait):
		t.Fatal("Replay did not ask the relay for a sequence")
	}
	res, err := rg.relay.Send(context.Background(), rg.msg("a@n1", "new"), true)
	if err != nil || res.Outcome != partition.Queued {
		t.Fatalf("send while a replayed message commits: %+v %v, want Queued (no direct attempt)", res, err)
	}
	// "new" is stored above n; it must wait for n. Watch the relay work
	// for a while: it must neither emit "new" nor spin.
	before := rg.relay.Stats().Iterations
	<-time.After(200 * time.Millisecond) // observing that nothing happens needs a window
	if c := rg.fake.callCount(); c != 0 {
		t.Fatalf("%d emissions while sequence %d was still committing", c, n)
	}
	if it := rg.relay.Stats().Iterations - before; it > 20 {
		t.Fatalf("the relay iterated %d times in 200 ms waiting for a lower sequence to commit", it)
	}
	release()
	if err := <-replayed; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "both delivered", func() bool { return rg.store.Stats().Depth == 0 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"replayed", "new"}) {
		t.Fatalf("ran %v", got)
	}
}

// heldSequencer stands between the store's Replay and the relay: it takes
// the relay's sequence, reports it and holds Replay until released.
type heldSequencer struct {
	relay    *partition.Relay
	reserved chan uint64
	proceed  chan struct{}
}

func (h *heldSequencer) Reserve(r string) (uint64, func(), error) {
	seq, done, err := h.relay.Reserve(r)
	h.reserved <- seq
	<-h.proceed
	return seq, done, err
}

// A node that crashes between an emission and its Ack sends the messages
// again after the restart; the receiver answers DUPLICATE for those that
// ran, the sender acks them, and none runs twice. The crash is a copy of
// the file taken while the committer is held, so the acks are not in it.
func TestCrashBetweenDeliverAndAck(t *testing.T) {
	rg := newRig(t, nil, nil)
	rg.queue(t, "a@n1", "m0", "m1", "m2")
	release := stall(t, rg.store) // the Ack cannot commit
	rg.relay.Start()
	testutil.WaitFor(t, wait, "ran", func() bool { return rg.fake.ranCount("a@n1") == 3 })
	crash := filepath.Join(t.TempDir(), "crash.db")
	b, err := os.ReadFile(rg.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(crash, b, 0o600); err != nil {
		t.Fatal(err)
	}
	release()
	cfg := rg.scfg
	cfg.Path = crash
	st, err := outbox.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Pending("a@n1") != 3 {
		t.Fatalf("pending after the crash %d, want 3", st.Pending("a@n1"))
	}
	rcfg := partition.DefaultConfig()
	rcfg.Logger = quiet
	r2, err := partition.New(rcfg, st, rg.fake) // the same receiver
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	r2.Start()
	testutil.WaitFor(t, wait, "acked after the restart", func() bool { return st.Pending("a@n1") == 0 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, []string{"m0", "m1", "m2"}) {
		t.Fatalf("ran %v", got)
	}
	if c := rg.fake.codes(); c[pb.Receipt_DUPLICATE] != 3 {
		t.Fatalf("receipts %v, want 3 duplicates after the restart", c)
	}
	if s := r2.Stats(); s.Restores != 0 {
		t.Fatalf("restart taken for a restore: %+v", s)
	}
}

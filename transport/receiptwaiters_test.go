package transport_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// jitterReplier answers every envelope from its own goroutine after a
// random number of yields, so receipts of one emission come back out of
// order and interleave with whatever the requester does. Each receipt
// carries the msg id also in Message and the envelope's sequence in
// Watermark, so a receipt given to the wrong waiter shows.
type jitterReplier struct {
	wg      sync.WaitGroup
	handled atomic.Int64
	replied atomic.Int64
	mu      sync.Mutex
	seen    map[string]int // msg id -> times handled
}

// newJitterReplier returns a replier whose reply goroutines are waited for
// at cleanup, after the node using it (started later) has closed: no
// HandleEnvelope can then add one.
func newJitterReplier(t *testing.T) *jitterReplier {
	j := &jitterReplier{seen: map[string]int{}}
	t.Cleanup(j.wg.Wait)
	return j
}

func (j *jitterReplier) HandleEnvelope(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	j.handled.Add(1)
	j.mu.Lock()
	j.seen[env.GetMsgId()]++
	j.mu.Unlock()
	if reply == nil {
		return
	}
	id, seq := env.GetMsgId(), env.GetSequence()
	yields := int(seq*2654435761) % 64
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		for range yields {
			runtime.Gosched()
		}
		rc := &pb.Receipt{MsgId: id, Code: pb.Receipt_PROCESSED, Message: "for " + id, Watermark: seq}
		if seq%7 == 0 {
			// Also the reply fallback: a receipt that names no msg id.
			rc.MsgId = ""
		}
		reply(rc)
		j.replied.Add(1)
	}()
}

// checkBatchResult: the receipts of a RequestBatch are each the receipt of
// their own envelope, all present without error, and with an error a
// prefix (receipts up to the first that did not come, nothing after).
func checkBatchResult(t *testing.T, envs []*pb.Envelope, rcs []*pb.Receipt, err error) (got int) {
	t.Helper()
	if len(rcs) != len(envs) {
		t.Fatalf("%d receipts for %d envelopes (err %v)", len(rcs), len(envs), err)
	}
	gap := -1
	for i, rc := range rcs {
		if rc == nil {
			if gap < 0 {
				gap = i
			}
			continue
		}
		got++
		if gap >= 0 {
			t.Fatalf("receipt %d present after missing receipt %d (err %v)", i, gap, err)
		}
		if rc.GetMsgId() != envs[i].GetMsgId() || rc.GetMessage() != "for "+envs[i].GetMsgId() || rc.GetWatermark() != envs[i].GetSequence() {
			t.Fatalf("receipt %d = %v, want the receipt of %s (seq %d)", i, rc, envs[i].GetMsgId(), envs[i].GetSequence())
		}
	}
	if err == nil && gap >= 0 {
		t.Fatalf("no error but receipt %d missing", gap)
	}
	if err != nil && gap < 0 {
		// Every receipt came: an error must then not claim one is missing.
		t.Fatalf("all receipts present but err %v", err)
	}
	return got
}

// Many RequestBatch calls at once to one peer, each cancelled at a random
// point while its receipts arrive out of order, some while the connection
// is replaced (Redial) or closed (ClosePeer). Every receipt returned must
// be its envelope's, in a prefix; nothing may hang, race or stay
// registered.
func TestRequestBatchCancelAndLossInterleavings(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	rep := newJitterReplier(t)
	startNode(t, testConfig(t, ca, "b"), r, rep)
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	rounds, workers, size := 60, 4, 40
	if raceEnabled {
		rounds = 25
	}
	var wg sync.WaitGroup
	var received, errs atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for round := range rounds {
				envs := make([]*pb.Envelope, 1+rng.IntN(size))
				for i := range envs {
					envs[i] = envTo(t, "w@b", pb.Envelope_RECEIPT_PROCESSED)
				}
				ctx, cancel := context.WithCancel(context.Background())
				stop := make(chan struct{})
				var side sync.WaitGroup
				side.Add(1)
				action := rng.IntN(5)
				spins := rng.IntN(2000)
				go func() {
					defer side.Done()
					for range spins {
						select {
						case <-stop:
							return
						default:
							runtime.Gosched()
						}
					}
					switch action {
					case 0, 1:
						cancel()
					case 2:
						if w == 0 && round%5 == 0 {
							a.ClosePeer("b", "test")
						} else {
							cancel()
						}
					case 3:
						if w == 1 && round%5 == 0 {
							rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
							_ = a.Redial(rctx, "b")
							rcancel()
						}
					}
				}()
				done := make(chan struct{})
				var rcs []*pb.Receipt
				var err error
				go func() {
					defer close(done)
					rcs, err = a.RequestBatch(ctx, "b", envs)
				}()
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					panic(fmt.Sprintf("RequestBatch hung (worker %d round %d)", w, round))
				}
				close(stop)
				side.Wait()
				cancel()
				received.Add(int64(checkBatchResult(t, envs, rcs, err)))
				if err != nil {
					errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	testutil.WaitFor(t, 10*time.Second, "no receipt waiter left registered", func() bool {
		return transport.Waiting(a.Transport, "b") == 0
	})
	t.Logf("receipts %d, batches with an error %d, handled %d", received.Load(), errs.Load(), rep.handled.Load())
}

// Forward with timeouts around the receipts' round trip: done is called
// exactly once per accepted Forward, with the receipt of its own envelope
// or an error, never both, and no waiter stays registered.
func TestForwardTimerRacesReceipt(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	rep := newJitterReplier(t)
	startNode(t, testConfig(t, ca, "b"), r, rep)
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	if _, err := a.Request(ctxT(t, 5*time.Second), "b", envTo(t, "w@b", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	n := 3000
	if raceEnabled {
		n = 1000
	}
	type call struct {
		env   *pb.Envelope
		calls atomic.Int32
		rc    atomic.Pointer[pb.Receipt]
		err   atomic.Pointer[error]
	}
	// Timeouts spread over zero to twice a measured round trip, in small
	// groups, so that about half the receipts come just before the timer
	// and half just after.
	start := time.Now()
	for range 20 {
		if _, err := a.Request(ctxT(t, 5*time.Second), "b", envTo(t, "w@b", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
			t.Fatal(err)
		}
	}
	rtt := time.Since(start) / 20
	calls := make([]*call, n)
	var accepted, finished atomic.Int64
	for i := range calls {
		cl := &call{env: envTo(t, "w@b", pb.Envelope_RECEIPT_PROCESSED)}
		calls[i] = cl
		timeout := rtt * time.Duration(i%41) / 20
		err := a.Forward("b", cl.env, timeout, func(rc *pb.Receipt, err error) {
			if cl.calls.Add(1) != 1 {
				panic("done called twice for " + cl.env.GetMsgId())
			}
			if rc != nil {
				cl.rc.Store(rc)
			}
			if err != nil {
				cl.err.Store(&err)
			}
			finished.Add(1)
		})
		if err != nil {
			cl.calls.Store(-1) // refused: done must never be called
			continue
		}
		accepted.Add(1)
		if i%4 == 3 {
			testutil.WaitFor(t, 20*time.Second, "the group's done called", func() bool { return finished.Load() == accepted.Load() })
		}
	}
	testutil.WaitFor(t, 20*time.Second, "every accepted Forward's done called", func() bool { return finished.Load() == accepted.Load() })
	rcs := 0
	for _, cl := range calls {
		switch c := cl.calls.Load(); {
		case c == -1:
			continue
		case c != 1:
			t.Fatalf("%s: done called %d times", cl.env.GetMsgId(), c)
		}
		rc, errp := cl.rc.Load(), cl.err.Load()
		if (rc == nil) == (errp == nil) {
			t.Fatalf("%s: done(%v, %v): want exactly one of receipt and error", cl.env.GetMsgId(), rc, errp)
		}
		if rc != nil {
			rcs++
			if rc.GetMsgId() != cl.env.GetMsgId() || rc.GetMessage() != "for "+cl.env.GetMsgId() || rc.GetWatermark() != cl.env.GetSequence() {
				t.Fatalf("%s got receipt %v", cl.env.GetMsgId(), rc)
			}
		}
	}
	testutil.WaitFor(t, 10*time.Second, "no receipt waiter left registered", func() bool {
		return transport.Waiting(a.Transport, "b") == 0
	})
	t.Logf("accepted %d of %d, %d with a receipt", accepted.Load(), n, rcs)
}

// The connection is replaced from either side, or closed by the peer,
// while emissions wait for their receipts: each batch ends (no hang) with
// its own receipts in a prefix, and the error of a batch cut short by the
// loss says so (ErrConnLost), not a context error.
func TestRequestBatchConnectionChurn(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	rep := newJitterReplier(t)
	b := startNode(t, testConfig(t, ca, "b"), r, rep)
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	rounds := 40
	if raceEnabled {
		rounds = 20
	}
	var cut atomic.Int64
	for round := range rounds {
		var wg sync.WaitGroup
		for w := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				envs := make([]*pb.Envelope, 20+w*10)
				for i := range envs {
					envs[i] = envTo(t, fmt.Sprintf("w%d@b", w), pb.Envelope_RECEIPT_PROCESSED)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				rcs, err := a.RequestBatch(ctx, "b", envs)
				if ctx.Err() != nil {
					t.Errorf("round %d: RequestBatch ran into its 20 s context: %v", round, err)
					return
				}
				checkBatchResult(t, envs, rcs, err)
				if err != nil {
					cut.Add(1)
					if !errors.Is(err, transport.ErrConnLost) && !errors.Is(err, transport.ErrUnreachable) {
						t.Errorf("round %d: err %v, want a connection loss", round, err)
					}
				}
			}()
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		switch round % 4 {
		case 0:
			_ = a.Redial(rctx, "b")
		case 1:
			_ = b.Redial(rctx, "a")
		case 2:
			b.ClosePeer("a", "test")
		case 3:
			a.ClosePeer("b", "test")
		}
		rcancel()
		wg.Wait()
	}
	testutil.WaitFor(t, 10*time.Second, "no receipt waiter left registered", func() bool {
		return transport.Waiting(a.Transport, "b") == 0
	})
	t.Logf("%d batches cut by a connection loss", cut.Load())
}

// A msg id sent again after its first request timed out: the first
// emission's late receipt and the second's both come; the second request
// gets one receipt for that msg id, the other is dropped as without a
// waiter, no waiter stays, and the next batch's receipts are its own.
func TestRequestBatchMsgIDReusedAfterTimeout(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	release := make(chan struct{})
	var held atomic.Int64
	var pending sync.WaitGroup
	t.Cleanup(pending.Wait)
	startNode(t, testConfig(t, ca, "b"), r, handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		id, seq := env.GetMsgId(), env.GetSequence()
		rc := &pb.Receipt{MsgId: id, Code: pb.Receipt_PROCESSED, Message: "for " + id, Watermark: seq}
		if held.Add(1) == 1 {
			// The first emission's receipt waits until the second emission
			// has arrived.
			pending.Add(1)
			go func() {
				defer pending.Done()
				<-release
				reply(rc)
			}()
			return
		}
		if env.GetMsgId() == "reused" {
			close(release)
		}
		reply(rc)
	}))
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	first := envTo(t, "w@b", pb.Envelope_RECEIPT_PROCESSED)
	first.MsgId = "reused"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		rcs, err := a.RequestBatch(ctx, "b", []*pb.Envelope{first})
		if rcs[0] != nil {
			err = fmt.Errorf("unexpected receipt %v (err %w)", rcs[0], err)
		}
		done <- err
	}()
	testutil.WaitFor(t, 5*time.Second, "b holds the first emission", func() bool { return held.Load() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("first request: %v, want context.Canceled", err)
	}
	if n := transport.Waiting(a.Transport, "b"); n != 0 {
		t.Fatalf("%d waiters left after the cancelled request", n)
	}
	second := envTo(t, "w@b", pb.Envelope_RECEIPT_PROCESSED)
	second.MsgId = "reused"
	rcs, err := a.RequestBatch(ctxT(t, 5*time.Second), "b", []*pb.Envelope{second})
	if err != nil || rcs[0].GetMsgId() != "reused" || rcs[0].GetMessage() != "for reused" {
		t.Fatalf("second request: %v, %v", rcs, err)
	}
	next := []*pb.Envelope{envTo(t, "w@b", pb.Envelope_RECEIPT_PROCESSED), envTo(t, "w@b", pb.Envelope_RECEIPT_PROCESSED)}
	rcs, err = a.RequestBatch(ctxT(t, 5*time.Second), "b", next)
	checkBatchResult(t, next, rcs, err)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "no waiter left", func() bool { return transport.Waiting(a.Transport, "b") == 0 })
}

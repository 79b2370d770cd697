package transport_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fillQueue sends big to "b" until the queue has refused for 10 ticks in a row.
func fillQueue(t *testing.T, a *node, big *pb.Envelope) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for full := 0; full < 10; {
		switch err := a.Send(ctx, "b", big); {
		case errors.Is(err, transport.ErrQueueFull):
			full++
			select {
			case <-tick.C:
			case <-ctx.Done():
				t.Fatal("the queue did not stay full")
			}
		case err != nil:
			t.Fatalf("filling the queue: %v", err)
		default:
			full = 0
		}
	}
}

func bigEnv(t *testing.T, pad int) *pb.Envelope {
	t.Helper()
	e := envTo(t, "slow@b", pb.Envelope_RECEIPT_NONE)
	var err error
	if e.Body, err = anypb.New(wrapperspb.Bytes(make([]byte, pad))); err != nil {
		t.Fatal(err)
	}
	return e
}

// The peer "b" moves to a new address (restarted elsewhere) while the old
// connection, still alive, has a full queue. Send would replace the stale
// connection (connFor/staleFor) and dial the new address, so Admit must
// not refuse on the old connection's queue: a Tell (Admit, then Send)
// would otherwise be refused for as long as the old connection lives.
func TestAdmitLooksPastAStaleConnectionsQueue(t *testing.T) {
	const pad = 200 << 10
	p := stalledPair(t, nil) // old b: alive, not reading
	a, ca, r := p.a, p.ca, p.r

	fillQueue(t, a, bigEnv(t, pad))

	// b restarts elsewhere: the resolver now gives the new address.
	rec := &recorder{}
	startNode(t, testConfig(t, ca, "b"), r, rec)

	body := wrapperspb.Bytes(make([]byte, pad)) // what the queue was filled with
	deadline := time.Now().Add(3 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	refusals := 0
	var last error
	for time.Now().Before(deadline) {
		err := a.Admit("b", body)
		if err == nil {
			break
		}
		last = err
		refusals++
		<-tick.C
	}
	if refusals > 0 {
		// What Send would have done with it:
		sendErr := a.Send(ctxT(t, 5*time.Second), "b", bigEnv(t, pad))
		t.Fatalf("Admit to b refused %d times over 3 s after b moved (last: %v); "+
			"a Send of the same message right after: err=%v (Send replaces the stale connection, Admit never lets a Tell reach it)",
			refusals, last, sendErr)
	}
}

// sendRetrying sends env to b, waiting out QueueFullErrors as they ask.
func sendRetrying(t *testing.T, a *node, env *pb.Envelope, deadline time.Time) {
	t.Helper()
	for {
		err := a.Send(ctxT(t, 5*time.Second), "b", env)
		var qf *transport.QueueFullError
		switch {
		case err == nil:
			return
		case errors.As(err, &qf) && time.Now().Before(deadline):
			time.Sleep(qf.RetryAfter) // what the error asks of its caller
		default:
			t.Fatalf("send: %v", err)
		}
	}
}

// The write rate is measured only when a batch's writes return, so a
// writer blocked in Write (the peer stopped reading) never lowers it; the
// hint must still grow once nothing has been written for a while, or a
// caller that follows it retries hundreds of times a second. And while
// the queue is crowded, an envelope that can never fit a frame gets
// ErrFrameTooLarge, not a retryable QueueFullError.
func TestRetryAfterGrowsWhileTheWriterIsStalled(t *testing.T) {
	const pad = 200 << 10
	var stall atomic.Bool
	p := stalledPair(t, stall.Load)
	a := p.a

	tooBig := bigEnv(t, 300<<10) // > MaxFrameSize: can never be sent
	if err := a.Send(ctxT(t, 5*time.Second), "b", tooBig); !errors.Is(err, transport.ErrFrameTooLarge) {
		t.Fatalf("oversized send to an empty queue: %v, want ErrFrameTooLarge", err)
	}

	// Phase 1: b reads; the connection measures its rate.
	deadline := time.Now().Add(15 * time.Second)
	for i := 0; i < 40; i++ {
		sendRetrying(t, a, bigEnv(t, pad), deadline)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, _, qb, _, rate := transport.QueueState(a.Transport, "b")
		if ok && qb == 0 && rate > 0 {
			t.Logf("measured rate while b reads: %d B/s", rate)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no rate measured / queue not drained (ok=%v qbytes=%d rate=%d)", ok, qb, rate)
		}
		<-tick.C
	}

	// Phase 2: b stops reading. Fill the queue, then wait until no byte has
	// left it for a second.
	stall.Store(true)
	fillQueue(t, a, bigEnv(t, pad))
	_, _, last, _, _ := transport.QueueState(a.Transport, "b")
	since := time.Now()
	for time.Since(since) < time.Second {
		<-tick.C
		if _, _, qb, _, _ := transport.QueueState(a.Transport, "b"); qb != last {
			last, since = qb, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatal("the queue never stopped draining")
		}
	}

	var problems []string
	if err := a.Send(ctxT(t, 5*time.Second), "b", tooBig); !errors.Is(err, transport.ErrFrameTooLarge) {
		problems = append(problems, "oversized send to the crowded queue: "+errString(err)+", want ErrFrameTooLarge (it can never be sent; QueueFull says retry)")
	}

	// A body too large for any frame is not Admit's to refuse: Send says
	// it can never go (the int64 overflow such sizes caused in RetryAfter
	// is TestRetryAfterOfAHugeExcessDoesNotOverflow's).
	v := structpb.NewStringValue(strings.Repeat("x", 1<<20))
	huge := &structpb.ListValue{}
	for range 10000 {
		huge.Values = append(huge.Values, v)
	}
	if err := a.Admit("b", huge); err != nil {
		problems = append(problems, "Admit of a body larger than any frame: "+err.Error()+", want nil (Send reports it too large)")
	}

	// A caller follows RetryAfter for 2 s while nothing is written.
	var hints []time.Duration
	end := time.Now().Add(2 * time.Second)
	big := bigEnv(t, pad)
	for time.Now().Before(end) {
		err := a.Send(ctxT(t, 5*time.Second), "b", big)
		var qf *transport.QueueFullError
		if !errors.As(err, &qf) {
			t.Fatalf("send to the stalled queue: %v, want a QueueFullError", err)
		}
		hints = append(hints, qf.RetryAfter)
		time.Sleep(qf.RetryAfter)
	}
	_, _, qb, _, rate := transport.QueueState(a.Transport, "b")
	if qb != last {
		t.Fatalf("queue drained meanwhile (%d -> %d): the test did not stall it", last, qb)
	}
	if len(hints) > 20 {
		problems = append(problems, fmt.Sprintf("after %v without a byte written, a caller following RetryAfter was refused %d times in 2 s (RetryAfter %v .. %v; rate still %d B/s)",
			time.Second, len(hints), slices.Min(hints), slices.Max(hints), rate))
	}
	if len(problems) > 0 {
		t.Fatal(strings.Join(problems, "\n"))
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// full computes excess*time.Second/rate in int64: an excess above ~9.2 GB
// overflows, and a larger excess gets a shorter RetryAfter (1 ms) than a
// smaller one (1 s). Admit's excess is cur+proto.Size(body)-limit, and a
// body's proto.Size can exceed that while it holds a few MB (a repeated
// field naming one large sub-message many times).
func TestRetryAfterOfAHugeExcessDoesNotOverflow(t *testing.T) {
	ca := newCA(t)
	tr := startNode(t, testConfig(t, ca, "a"), newResolver(), &recorder{})
	const rate = 100 << 20                                 // 100 MiB/s
	small := transport.RetryFor(tr.Transport, rate, 1<<30) // 1 GiB excess: 10 s, clamped to 1 s
	large := transport.RetryFor(tr.Transport, rate, 10e9)  // 10 GB excess
	v := structpb.NewStringValue(strings.Repeat("x", 1<<20))
	list := &structpb.ListValue{}
	for range 10000 {
		list.Values = append(list.Values, v)
	}
	t.Logf("a body holding ~1 MiB has proto.Size %d", proto.Size(list))
	if large < small {
		t.Fatalf("RetryAfter for 1 GiB excess = %v, for 10 GB excess = %v: int64 overflow in excess*time.Second", small, large)
	}
}

// noteRate computes n*writers*time.Second in int64: a batch of 2 GiB
// (possible with MaxFrameSize up to 1 GiB and an unbounded SendQueueBytes)
// written in 1 s while 8 lanes write overflows, and the connection's
// rate becomes 1 B/s, so every refusal says "retry in 1 s".
func TestWriteRateOfAHugeBatchDoesNotOverflow(t *testing.T) {
	ca := newCA(t)
	tr := startNode(t, testConfig(t, ca, "a"), newResolver(), &recorder{})
	n := 1 << 30 // 2 GiB on 64-bit platforms; an int has 32 bits on others
	if math.MaxInt > 1<<32 {
		n <<= 1
	}
	got := transport.RateAfter(tr.Transport, n, time.Second, 8)
	if want := int64(n) * 8; got < want/2 {
		t.Fatalf("rate after writing %d B in 1 s with 8 lanes writing = %d B/s, want ~%d B/s; RetryAfter for 1 MiB excess then = %v",
			n, got, want, transport.RetryFor(tr.Transport, got, 1<<20))
	}
}

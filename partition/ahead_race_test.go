package partition_test

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

// gateClock is the system clock, except that while armed, the first
// goroutine reading it from inside the relay's read-ahead goroutine (the
// store's Head calls Monotonic just before taking its snapshot) waits
// until the test opens the gate: a read ahead whose goroutine is
// scheduled late, as any goroutine may be.
type gateClock struct {
	armed   atomic.Bool
	reached chan struct{} // closed when the read ahead waits at the gate
	open    chan struct{} // closed by the test
	once    sync.Once
}

func newGateClock() *gateClock {
	return &gateClock{reached: make(chan struct{}), open: make(chan struct{})}
}

func (c *gateClock) Now() time.Time { return outbox.SystemClock().Now() }

func (c *gateClock) Monotonic() time.Duration {
	if c.armed.Load() {
		buf := make([]byte, 16<<10)
		if strings.Contains(string(buf[:runtime.Stack(buf, false)]), "readAhead.func") && c.armed.CompareAndSwap(true, false) {
			c.once.Do(func() { close(c.reached) })
			<-c.open
		}
	}
	return outbox.SystemClock().Monotonic()
}

// A message whose sequence was taken after an emission was made, and
// committed after the stream's next emission was read ahead, is not in
// what was read ahead; a later one of the same stream, committed before
// the read, must not be either. Otherwise, once the lower one has
// committed, Head would return it first while the read ahead sends the
// higher one without it; the lower one would go out next, below the
// receiver's watermark: DUPLICATE, acked, its handler never run.
func TestReadAheadBelowSequencesTakenAfterTheEmission(t *testing.T) {
	clk := newGateClock()
	rg := aheadRig(t, func(c *outbox.Config) { c.Clock = clk })
	const rcpt = "a@n1"
	rg.queue(t, rcpt, "m1", "m2", "m3", "m4", "m5", "m6")

	firstHeld := make(chan struct{})
	releaseFirst := make(chan struct{})
	var holdOnce sync.Once
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, _ []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n == 0 {
				holdOnce.Do(func() { close(firstHeld) })
				<-releaseFirst
			}
			return nil, nil, false
		}
	})
	clk.armed.Store(true)
	rg.relay.Start()

	// Emission 0 ([m1..m4]) was made with nothing storing (Below 0); its
	// read ahead waits at the gate before taking its snapshot.
	select {
	case <-clk.reached:
	case <-time.After(wait):
		t.Fatal("the read ahead never started")
	}
	// Two producers of the stream: a reserves first, b second; b's commit
	// is the faster one (as two concurrent Sends may be).
	seqA, doneA, err := rg.relay.Reserve(rcpt)
	if err != nil {
		t.Fatal(err)
	}
	rg.queue(t, rcpt, "b") // reserved after a, committed now
	close(clk.open)        // the read ahead reads [m5 m6 b]
	testutil.WaitFor(t, wait, "read ahead ended", func() bool { return rg.relay.AheadRead(rcpt) })
	// Now a commits and its storing ends: a Head would return m5 m6 a b.
	a := rg.msg(rcpt, "a")
	a.Envelope.Sequence = seqA
	if _, err := rg.store.Enqueue(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	doneA()
	<-firstHeld
	close(releaseFirst)

	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	want := []string{"m1", "m2", "m3", "m4", "m5", "m6", "a", "b"}
	if got := rg.fake.ranTypes(rcpt); !slices.Equal(got, want) {
		t.Fatalf("handler ran %v, want %v (receipts %v, emissions read ahead %d)",
			got, want, rg.fake.codes(), rg.relay.Stats().ReadAhead)
	}
}

// A stream whose emission came back clean keeps what it read ahead until
// its next emission; when its peer dies before that one (and later leaves
// the cluster), what it read is dropped: four such peers must not fill
// maxAhead, nor keep their streams and messages in memory.
func TestReadAheadDroppedWhenPeersLeave(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	rg := newRig(t, func(c *outbox.Config) { c.Clock = clk }, func(c *partition.Config) {
		c.BatchSize = 4
		c.Limiter = partition.LimiterConfig{Initial: 64, Min: 1, Max: 64}
	})
	dead := []string{"d@n1", "d@n2", "d@n3", "d@n4"}
	var seen sync.Map
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			rcpt := envs[0].GetRecipient()
			if !slices.Contains(dead, rcpt) {
				return nil, nil, false
			}
			if _, again := seen.LoadOrStore(rcpt, true); again {
				return nil, nil, false
			}
			// The emission is received and processed; its peer dies right
			// after answering, with its next emission read ahead.
			testutil.WaitFor(t, wait, "read ahead", func() bool { return rg.relay.AheadRead(rcpt) })
			rcs := make([]*pb.Receipt, len(envs))
			for i, e := range envs {
				rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: e.GetSequence()}
			}
			rg.fake.set(func(f *fake) { f.down[strings.TrimPrefix(rcpt, "d@")] = true })
			return rcs, nil, true
		}
	})
	for _, rcpt := range dead {
		sms := make([]*pb.StoredMessage, 8)
		for i := range sms {
			sms[i] = rg.msg(rcpt, "x")
			sms[i].Envelope.TtlMs = 5_000
		}
		rg.storeAll(t, sms...)
	}
	rg.relay.Start()
	testutil.WaitFor(t, wait, "first emissions acked", func() bool { return rg.store.Stats().Depth == 16 })
	// The dead peers' messages run out of TTL; the peers leave the cluster.
	clk.Advance(6 * time.Second)
	testutil.WaitFor(t, wait, "expired", func() bool { return rg.store.Stats().Depth == 0 })
	for _, rcpt := range dead {
		node := strings.TrimPrefix(rcpt, "d@")
		testutil.WaitFor(t, wait, "peer forgotten", func() bool { return rg.relay.ForgetPeer(node) })
	}
	var kept []string
	for _, rcpt := range dead {
		if rg.relay.AheadRead(rcpt) {
			kept = append(kept, rcpt)
		}
	}
	// A healthy stream drains: as in TestReadAheadDrainsInOrder, most of
	// its 6 emissions should go out read ahead.
	msgs := names("m", 22)
	rg.queue(t, "h@n9", msgs...)
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	if got := rg.fake.ranTypes("h@n9"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v", got)
	}
	st := rg.relay.Stats()
	if len(kept) > 0 || st.ReadAhead < 3 {
		t.Fatalf("after their peers left, %v still hold a read ahead; the healthy stream sent %d of %d emissions read ahead, want most of the 6",
			kept, st.ReadAhead, st.Batches-4)
	}
}

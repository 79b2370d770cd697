package transport_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

func TestTellAndRequest(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) {
			ca := newCA(t)
			r := newResolver()
			nodes := make([]*node, n)
			recs := make([]*recorder, n)
			for i := range nodes {
				recs[i] = &recorder{}
				nodes[i] = startNode(t, testConfig(t, ca, fmt.Sprintf("n%d", i+1)), r, recs[i])
			}
			ctx := ctxT(t, 10*time.Second)
			for i, from := range nodes {
				for j, to := range nodes {
					if i == j {
						continue
					}
					tell := envTo(t, "a@"+to.name, pb.Envelope_RECEIPT_NONE)
					if err := from.Send(ctx, to.name, tell); err != nil {
						t.Fatalf("%s tell %s: %v", from.name, to.name, err)
					}
					req := envTo(t, "b@"+to.name, pb.Envelope_RECEIPT_PROCESSED)
					rc, err := from.Request(ctx, to.name, req)
					if err != nil {
						t.Fatalf("%s request %s: %v", from.name, to.name, err)
					}
					if rc.GetMsgId() != req.GetMsgId() || rc.GetCode() != pb.Receipt_PROCESSED || rc.GetMessage() != "b@"+to.name {
						t.Fatalf("receipt %v for %s", rc, req.GetMsgId())
					}
				}
			}
			for i, rec := range recs {
				testutil.WaitFor(t, 5*time.Second, "all envelopes arrive", func() bool { return rec.count.Load() == int64(2*(n-1)) })
				envs, from := rec.snapshot()
				for k, e := range envs {
					if e.GetRecipient() != "a@"+nodes[i].name && e.GetRecipient() != "b@"+nodes[i].name {
						t.Errorf("%s got envelope for %s", nodes[i].name, e.GetRecipient())
					}
					if from[k].Name == nodes[i].name || from[k].BootID == "" {
						t.Errorf("bad sender info %+v", from[k])
					}
				}
			}
			stats := nodes[0].PeerStats()
			if s := stats[nodes[1].name]; s.FramesOut < 2 || s.FramesIn < 2 || s.BytesOut == 0 || s.BytesIn == 0 {
				t.Errorf("stats for %s: %+v", nodes[1].name, s)
			}
		})
	}
}

// TestOrder sends many tells to one recipient and checks they arrive in order.
func TestOrder(t *testing.T) {
	total := 100_000
	if raceEnabled {
		total = 25_000 // same path, fewer messages: -race makes each ~15× slower
	}
	ca := newCA(t)
	r := newResolver()
	var mu sync.Mutex // mu guards the fields below
	var got int
	var bad error
	next := uint64(1)
	h := handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, _ func(*pb.Receipt)) {
		mu.Lock()
		defer mu.Unlock()
		if env.GetSequence() != next && bad == nil {
			bad = fmt.Errorf("got sequence %d, want %d", env.GetSequence(), next)
		}
		next = env.GetSequence() + 1
		got++
	})
	cfgA := testConfig(t, ca, "a")
	cfgA.SendQueueSize = total // measure order, not back-pressure
	a := startNode(t, cfgA, r, &recorder{})
	startNode(t, testConfig(t, ca, "b"), r, h)
	start := time.Now()
	ctx := ctxT(t, 30*time.Second)
	env := envTo(t, "sink@b", pb.Envelope_RECEIPT_NONE)
	for i := uint64(1); i <= uint64(total); i++ {
		env.Sequence = i // Send encodes at once, so the envelope is reused
		for {
			err := a.Send(ctx, "b", env)
			if err == nil {
				break
			}
			if !errors.Is(err, transport.ErrQueueFull) {
				t.Fatalf("send %d: %v", i, err)
			}
			// Back-pressure: wait until the receiver caught up a little.
			mu.Lock()
			seen := got
			mu.Unlock()
			testutil.WaitFor(t, 10*time.Second, "receiver progresses", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return got > seen
			})
		}
	}
	testutil.WaitFor(t, 20*time.Second, "all tells arrive", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got == total
	})
	t.Logf("%d tells in %v", total, time.Since(start))
	mu.Lock()
	defer mu.Unlock()
	if bad != nil {
		t.Fatal(bad)
	}
}

func TestRequestBatchOrder(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	rec := &recorder{}
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	startNode(t, testConfig(t, ca, "b"), r, rec)
	envs := make([]*pb.Envelope, 200)
	for i := range envs {
		envs[i] = envTo(t, "w@b", pb.Envelope_RECEIPT_ACCEPTED)
	}
	rcs, err := a.RequestBatch(ctxT(t, 10*time.Second), "b", envs)
	if err != nil {
		t.Fatal(err)
	}
	for i, rc := range rcs {
		if rc.GetMsgId() != envs[i].GetMsgId() {
			t.Fatalf("receipt %d is for %q, want %q", i, rc.GetMsgId(), envs[i].GetMsgId())
		}
	}
	got, _ := rec.snapshot()
	for i, e := range got {
		if e.GetMsgId() != envs[i].GetMsgId() {
			t.Fatalf("envelope %d is %q, want %q", i, e.GetMsgId(), envs[i].GetMsgId())
		}
	}

	bad := []struct {
		name string
		envs []*pb.Envelope
	}{
		{"no msg id", []*pb.Envelope{{Recipient: "w@b", Receipt: pb.Envelope_RECEIPT_ACCEPTED}}},
		{"no receipt mode", []*pb.Envelope{{MsgId: "x", Recipient: "w@b"}}},
		{"mixed recipients", []*pb.Envelope{
			{MsgId: "x", Recipient: "w@b", Receipt: pb.Envelope_RECEIPT_ACCEPTED},
			{MsgId: "y", Recipient: "v@b", Receipt: pb.Envelope_RECEIPT_ACCEPTED}}},
		{"duplicate msg id", []*pb.Envelope{
			{MsgId: "x", Recipient: "w@b", Receipt: pb.Envelope_RECEIPT_ACCEPTED},
			{MsgId: "x", Recipient: "w@b", Receipt: pb.Envelope_RECEIPT_ACCEPTED}}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := a.RequestBatch(ctxT(t, time.Second), "b", tc.envs); !errors.Is(err, transport.ErrBadEnvelope) {
				t.Fatalf("err = %v, want ErrBadEnvelope", err)
			}
		})
	}
}

func TestQueueFull(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*transport.Config)
		want string
	}{
		{"by envelopes", func(c *transport.Config) { c.SendQueueSize = 4 }, "envelopes queued"},
		{"by bytes", func(c *transport.Config) {
			c.SendQueueSize, c.MaxFrameSize, c.SendQueueBytes = 1<<20, 128<<10, 256<<10
		}, "bytes queued"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := newCA(t)
			r := newResolver()
			release := make(chan struct{})
			var once sync.Once
			h := handlerFunc(func(transport.PeerInfo, *pb.Envelope, func(*pb.Receipt)) { <-release })
			cfgA := testConfig(t, ca, "a")
			tc.mut(&cfgA)
			a := startNode(t, cfgA, r, &recorder{})
			startNode(t, testConfig(t, ca, "b"), r, h)
			t.Cleanup(func() { once.Do(func() { close(release) }) }) // runs before the Close cleanups
			env := envTo(t, "slow@b", pb.Envelope_RECEIPT_NONE)
			env.Headers = map[string]string{"pad": string(make([]byte, 64<<10))}
			ctx := ctxT(t, 10*time.Second)
			var err error
			for i := 0; i < 5000 && err == nil; i++ {
				err = a.Send(ctx, "b", env)
			}
			if !errors.Is(err, transport.ErrQueueFull) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrQueueFull (%s)", err, tc.want)
			}
			var qf *transport.QueueFullError
			if !errors.As(err, &qf) || qf.Peer != "b" || !strings.HasPrefix(tc.want, qf.Unit) {
				t.Fatalf("err = %#v, want a *QueueFullError for b in %s", err, tc.want)
			}
			if qf.RetryAfter < time.Millisecond || qf.RetryAfter > time.Second {
				t.Fatalf("RetryAfter = %v, want within [1ms, 1s]", qf.RetryAfter)
			}
			once.Do(func() { close(release) })
		})
	}
}

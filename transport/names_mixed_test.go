package transport_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// shapedEnvelope builds the i-th envelope of goroutine g, of many shapes.
func shapedEnvelope(g, i int, rcpt string, receipt bool) *pb.Envelope {
	env := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("g%d-%d", g, i), Sender: "@a", Recipient: rcpt,
		CreatedAtUnixMs: int64(i), Sequence: uint64(i + 1), TtlMs: 5000}
	k := (g*31 + i*7) % 150 // many more than 64 types
	url := typeURL(k)
	switch {
	case k%37 == 0:
		url += strings.Repeat("L", 4200) // longer than the names bound alone
	case k%13 == 0:
		url += strings.Repeat("M", 700) // uses up the names' bytes
	}
	val := []byte(fmt.Sprintf("%s|%d|%s", url, i, strings.Repeat("v", (i*211)%3000)))
	switch i % 9 {
	case 0: // no body
	case 1:
		env.Body = &anypb.Any{Value: val} // no type
	case 2:
		env.Body = &anypb.Any{TypeUrl: url} // no value
	case 3:
		env.Body = &anypb.Any{} // empty body
	default:
		env.Body = &anypb.Any{TypeUrl: url, Value: val}
	}
	if i%3 == 0 {
		env.Headers = map[string]string{"trace": fmt.Sprint(i), "z": "y", "a": ""}
	}
	if i%2 == 0 {
		env.Rpc = &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, CorrelationId: fmt.Sprintf("c-%d", i), ReplyTo: "r@a", Service: "s", Method: "m"}
	}
	if i%5 == 0 {
		env.CoalesceKey = "ck"
		env.PrevSequence = uint64(i)
		env.StreamEpoch = 3
	}
	if receipt {
		env.Receipt = pb.Envelope_RECEIPT_PROCESSED
	}
	return env
}

// Many goroutines mix Send, Request, RequestBatch and named SendEncoded on
// the same lanes of a connection with small queues, with envelopes of
// every shape and more types than a stream names (long URLs too), and
// clear what they sent once each send returns. Every envelope b gets is
// the one sent, once, in each goroutine's order; everything accepted
// arrives; the connection is never closed for bad input; the queue drains
// and the counters agree.
func TestEverySendMixedOnSmallQueues(t *testing.T) { sendMixed(t, false) }

// The same while a's connection to b is closed again and again: names
// reset with each connection's streams, so what arrives is what was sent.
func TestEverySendMixedWhileConnectionsAreReplaced(t *testing.T) { sendMixed(t, true) }

func sendMixed(t *testing.T, churn bool) {
	ca, r := newCA(t), newResolver()
	cfg := testConfig(t, ca, "a")
	cfg.SendQueueSize = 24
	cfg.MaxFrameSize, cfg.SendQueueBytes = 32<<10, 64<<10
	cfg.Lanes = 2
	a := startNode(t, cfg, r, &recorder{})

	check := newAsSent(churn)
	bcfg := testConfig(t, ca, "b")
	b := startNode(t, bcfg, r, handlerFunc(check.handle))
	ctx := ctxT(t, 120*time.Second)
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	for g := range 12 {
		wg.Go(func() {
			for i := 0; i < 150; {
				rcpt := fmt.Sprintf("r%d@b", (g+i/20)%3)
				mode := (g + i) % 4
				var envs []*pb.Envelope
				switch mode {
				case 0, 1: // Send / SendEncoded
					envs = []*pb.Envelope{shapedEnvelope(g, i, rcpt, false)}
				case 2: // Request
					envs = []*pb.Envelope{shapedEnvelope(g, i, rcpt, true)}
				case 3: // RequestBatch
					n := 1 + (g*5+i)%12
					for j := range n {
						envs = append(envs, shapedEnvelope(g, i+j, rcpt, true))
					}
				}
				for _, e := range envs {
					check.expect(e.GetMsgId(), proto.Clone(e).(*pb.Envelope))
				}
				var err error
				for range 400 {
					switch mode {
					case 0:
						err = a.Send(ctx, "b", envs[0])
					case 1:
						e := envs[0]
						url := e.GetBody().GetTypeUrl()
						route, okr := envcodec.NewRoute(e.Sender, e.Recipient, url)
						if url == "" || !okr {
							err = a.Send(ctx, "b", e)
							break
						}
						wire, where := route.Append(nil, envcodec.Plain{ID: []byte(e.MsgId), CreatedAtUnixMs: e.CreatedAtUnixMs, Kind: pb.RpcMeta_EVENT, Value: e.Body.Value, TtlMs: e.TtlMs})
						var plain pb.Envelope
						if uerr := proto.Unmarshal(wire, &plain); uerr != nil {
							t.Error(uerr)
							return
						}
						check.expect(e.MsgId, &plain)
						err = a.SendEncoded(ctx, "b", e.Recipient, wire, where)
						clear(wire)
					case 2:
						_, err = a.Request(ctx, "b", envs[0])
					case 3:
						_, err = a.RequestBatch(ctx, "b", envs)
					}
					if !errors.Is(err, transport.ErrQueueFull) {
						break
					}
					refused.Add(1)
					runtime.Gosched()
				}
				lost := errors.Is(err, transport.ErrConnLost) || errors.Is(err, transport.ErrUnreachable)
				if err != nil && !errors.Is(err, transport.ErrQueueFull) && (!churn || !lost) {
					t.Errorf("g%d i%d mode %d: %v", g, i, mode, err)
				}
				if err == nil {
					ok.Add(int64(len(envs)))
				}
				// The caller's once the send returned.
				for _, e := range envs {
					if e.Body != nil {
						clear(e.Body.Value)
						e.Body.TypeUrl = "mutated"
					}
					e.MsgId = "mutated"
					e.Headers = nil
				}
				i += len(envs)
			}
		})
	}
	stop := make(chan struct{})
	var closes atomic.Int64
	var cw sync.WaitGroup
	if churn {
		cw.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if check.got.Load() > closes.Load()*40 {
					closes.Add(1)
					if closes.Load()%2 == 0 {
						a.ClosePeer("b", "churn")
					} else {
						b.ClosePeer("a", "churn")
					}
				}
				runtime.Gosched()
			}
		})
	}
	wg.Wait()
	close(stop)
	cw.Wait()
	if churn {
		check.fail(t)
		t.Logf("%d closes, %d accepted, %d got", closes.Load(), ok.Load(), check.got.Load())
		noBadInput(t, a, b)
		return
	}
	waitCond(t, 30*time.Second, "every accepted envelope at b", func() bool { return check.got.Load() >= ok.Load() })
	check.fail(t)
	if check.got.Load() != ok.Load() {
		t.Fatalf("b got %d, %d accepted", check.got.Load(), ok.Load())
	}
	waitCond(t, 15*time.Second, "the queue empty", func() bool {
		frames, bytes := transport.Queued(a.Transport, "b")
		return frames == 0 && bytes == 0
	})
	waitCond(t, 5*time.Second, "counters agree", func() bool {
		out, in := a.PeerStats()["b"], b.PeerStats()["a"]
		return out.BytesOut == in.BytesIn && out.FramesOut == in.FramesIn
	})
	noBadInput(t, a, b)
	t.Logf("%d accepted, %d refusals", ok.Load(), refused.Load())
}

// asSent is a handler that checks what it gets against what the senders
// said they sent (expect): each envelope once and as sent, and, unless
// connections are replaced (churn), in each sender's order per
// recipient. Msg ids start "g<sender>-<i>".
type asSent struct {
	churn      bool
	sent, seen sync.Map // msg id -> *pb.Envelope; msg id -> struct{}
	got        atomic.Int64
	mu         sync.Mutex
	last       map[string]int // sender and recipient -> the last i got
	bad        []string
}

func newAsSent(churn bool) *asSent { return &asSent{churn: churn, last: map[string]int{}} }

// expect says that env (which the checker keeps) is sent under id.
func (c *asSent) expect(id string, env *pb.Envelope) { c.sent.Store(id, env) }

func (c *asSent) handle(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	c.got.Add(1)
	id := env.GetMsgId()
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.seen.LoadOrStore(id, struct{}{}); dup {
		c.bad = append(c.bad, "duplicate "+id)
	}
	if want, ok := c.sent.Load(id); !ok {
		c.bad = append(c.bad, "unknown "+id)
	} else if !proto.Equal(want.(*pb.Envelope), env) {
		c.bad = append(c.bad, fmt.Sprintf("%s arrived as\n%v\nsent\n%v", id, env, want))
	}
	var g, i int
	fmt.Sscanf(id, "g%d-%d", &g, &i)
	key := fmt.Sprint(g, "/", env.GetRecipient())
	if p, ok := c.last[key]; ok && p >= i && !c.churn {
		c.bad = append(c.bad, fmt.Sprintf("%s after g%d-%d: reordered", id, g, p))
	}
	c.last[key] = i
	if reply != nil {
		reply(&pb.Receipt{MsgId: id, Code: pb.Receipt_PROCESSED})
	}
}

// fail fails t with the first bad arrival, if any.
func (c *asSent) fail(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bad) > 0 {
		t.Fatalf("%d bad arrivals; first: %s", len(c.bad), c.bad[0])
	}
}

// noBadInput fails t when a connection of one of nodes was closed for
// bad input, with the log around it.
func noBadInput(t *testing.T, nodes ...*node) {
	t.Helper()
	for _, n := range nodes {
		l := n.logs.String()
		if i := strings.Index(l, "bad input"); i >= 0 {
			t.Fatalf("a connection closed for bad input: %s", l[max(0, i-300):min(len(l), i+300)])
		}
	}
}

// checkArrivedAsSent checks that b got
// each envelope of sent, in order, and that the queue and counters agree.
func checkArrivedAsSent(t *testing.T, a, b *node, rec *recorder, had int64, sent []*pb.Envelope) {
	t.Helper()
	waitCond(t, 20*time.Second, "every envelope at b", func() bool { return rec.count.Load() >= had+int64(len(sent)) })
	got, _ := rec.snapshot()
	got = got[had:]
	if len(got) != len(sent) {
		t.Fatalf("b got %d envelopes, %d sent", len(got), len(sent))
	}
	for i := range sent {
		if !proto.Equal(got[i], sent[i]) {
			t.Fatalf("envelope %d arrived as\n%v\nsent\n%v", i, got[i], sent[i])
		}
	}
	waitCond(t, 10*time.Second, "the queue empty and counters agree", func() bool {
		frames, bytes := transport.Queued(a.Transport, "b")
		out, in := a.PeerStats()["b"], b.PeerStats()["a"]
		return frames == 0 && bytes == 0 && out.BytesOut == in.BytesIn && out.FramesOut == in.FramesIn
	})
	noBadInput(t, a, b)
}

// Runs at the names' edges: a URL of exactly the bytes bound, then types
// past it; one run naming more types than the count bound (64 named, the
// rest in full) mixed with bodies in full (forwarded ones with an origin,
// an Any with an unknown field); a URL longer than the bound; the same
// type twice in a run. Each arrives as sent.
func TestRunsAtTheNamesBounds(t *testing.T) {
	a, b, rec := typedPair(t, false)
	ctx := ctxT(t, 30*time.Second)
	mk := func(id, url string, val string) *pb.Envelope {
		return &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: id, Sender: "@a", Recipient: "sink@b",
			Body: &anypb.Any{TypeUrl: url, Value: []byte(val)}, Receipt: pb.Envelope_RECEIPT_PROCESSED}
	}
	var sent []*pb.Envelope
	send := func(run []*pb.Envelope) {
		t.Helper()
		for _, e := range run {
			sent = append(sent, proto.Clone(e).(*pb.Envelope))
		}
		if _, err := a.RequestBatch(ctx, "b", run); err != nil {
			t.Fatal(err)
		}
	}
	// A URL of exactly 4 KiB, then others: in full once the bytes are used up.
	big := strings.Repeat("u", 4096)
	send([]*pb.Envelope{mk("big-1", big, "x"), mk("big-2", "t/small", "y"), mk("big-3", big, ""), mk("big-4", "t/small", "")})
	checkArrivedAsSent(t, a, b, rec, 0, sent)
}

// One run of more types than a stream names, on a fresh stream, with
// forwarded-shaped and unknown-field bodies among them and a type twice.
func TestOneRunPastTheNamesCountBound(t *testing.T) {
	a, b, rec := typedPair(t, false)
	ctx := ctxT(t, 30*time.Second)
	var run []*pb.Envelope
	for i := range 80 {
		e := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("r-%d", i), Sender: "@a", Recipient: "sink@b",
			Body: &anypb.Any{TypeUrl: typeURL(i % 75), Value: []byte(fmt.Sprint(i))}, Receipt: pb.Envelope_RECEIPT_PROCESSED}
		switch i % 10 {
		case 3:
			e.Body.ProtoReflect().SetUnknown([]byte{0x18, 0x07}) // field 3 varint 7
		case 7:
			e.Body.TypeUrl = strings.Repeat("z", 5000) // past the bytes bound alone
		}
		run = append(run, e)
	}
	var sent []*pb.Envelope
	for _, e := range run {
		sent = append(sent, proto.Clone(e).(*pb.Envelope))
	}
	if _, err := a.RequestBatch(ctx, "b", run); err != nil {
		t.Fatal(err)
	}
	// And again, every type now named or past the bound.
	run2 := make([]*pb.Envelope, len(run))
	for i, e := range run {
		c := proto.Clone(e).(*pb.Envelope)
		c.MsgId += "-again"
		run2[i] = c
		sent = append(sent, proto.Clone(c).(*pb.Envelope))
	}
	if _, err := a.RequestBatch(ctx, "b", run2); err != nil {
		t.Fatal(err)
	}
	checkArrivedAsSent(t, a, b, rec, 0, sent)
}

// A run refused for an envelope the codec cannot write (invalid UTF-8 in
// the middle) leaves nothing behind: no frame, no name, no room; the next
// runs of the same types arrive as sent, named from ref 1.
func TestRunRefusedMidwayLeavesNothing(t *testing.T) {
	a, b, rec := typedPair(t, false)
	ctx := ctxT(t, 30*time.Second)
	mk := func(id string, k int) *pb.Envelope {
		return &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: id, Sender: "@a", Recipient: "sink@b",
			Body: &anypb.Any{TypeUrl: typeURL(k), Value: []byte(id)}, Receipt: pb.Envelope_RECEIPT_PROCESSED}
	}
	var run []*pb.Envelope
	for i := range 10 {
		run = append(run, mk(fmt.Sprintf("bad-%d", i), i))
	}
	run[5].Type = "\xff\xfe" // invalid UTF-8: proto refuses to encode it
	if _, err := a.RequestBatch(ctx, "b", run); err == nil {
		t.Fatal("a run with invalid UTF-8 was sent")
	}
	if f, by := transport.Queued(a.Transport, "b"); f != 0 || by != 0 {
		t.Fatalf("queue holds %d frames, %d bytes after a refused run", f, by)
	}
	var sent []*pb.Envelope
	for round := range 3 {
		run = run[:0]
		for i := range 12 {
			run = append(run, mk(fmt.Sprintf("ok-%d-%d", round, i), (i+round)%13))
		}
		for _, e := range run {
			sent = append(sent, proto.Clone(e).(*pb.Envelope))
		}
		if _, err := a.RequestBatch(ctx, "b", run); err != nil {
			t.Fatal(err)
		}
	}
	checkArrivedAsSent(t, a, b, rec, 0, sent)
}

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
	"github.com/meshnode/meshnode/internal/rawpeer"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// typeCheckingPair starts a, whose queue to b holds at most queued
// envelopes and 128 KiB, and b, whose handler counts what it gets
// (got), stores in bad the first envelope whose type is not what its value
// says ("type|...", or "type|sender|recipient|..." to check those too),
// and answers receipts.
func typeCheckingPair(t *testing.T, queued int) (a *node, got *atomic.Int64, bad *atomic.Value) {
	t.Helper()
	ca, r := newCA(t), newResolver()
	cfg := testConfig(t, ca, "a")
	cfg.SendQueueSize = queued
	cfg.MaxFrameSize, cfg.SendQueueBytes = 64<<10, 128<<10
	a = startNode(t, cfg, r, &recorder{})
	got, bad = new(atomic.Int64), new(atomic.Value)
	h := handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		got.Add(1)
		v := string(env.GetBody().GetValue())
		want := strings.SplitN(v, "|", 4)
		if len(want) < 2 || env.GetBody().GetTypeUrl() != want[0] ||
			len(want) == 4 && (env.GetSender() != want[1] || env.GetRecipient() != want[2]) {
			bad.Store(fmt.Sprintf("%s → %s of type %q, value %.80q", env.GetSender(), env.GetRecipient(), env.GetBody().GetTypeUrl(), v))
		}
		if reply != nil {
			reply(&pb.Receipt{Code: pb.Receipt_PROCESSED})
		}
	})
	startNode(t, testConfig(t, ca, "b"), r, h)
	return a, got, bad
}

// Many goroutines send named envelopes of many types (past the names
// bounds, some URLs long) and full ones on the same lanes of a connection
// whose queue bounds refuse many of them: every envelope b gets has the
// type its value says, and the queue drains to nothing (a refused frame
// leaves no name, room or bytes behind).
func TestNamedAndFullSendsShareASmallQueue(t *testing.T) {
	a, got, bad := typeCheckingPair(t, 32)
	ctx := ctxT(t, 60*time.Second)
	var wg sync.WaitGroup
	var ok, byBytes atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			for i := range 300 {
				k := (g*7 + i) % 90
				url := typeURL(k)
				if k%11 == 0 {
					url += strings.Repeat("L", 600) // a few use up the bytes bound
				}
				rcpt := fmt.Sprintf("r%d@b", (g+i)%3)
				route, _ := envcodec.NewRoute("@a", rcpt, url)
				val := []byte(url + "|" + strings.Repeat("x", (i*379)%12000))
				wire, body := route.Append(nil, envcodec.Plain{ID: []byte(fmt.Sprintf("m-%d-%d", g, i)), Kind: pb.RpcMeta_EVENT, Value: val, TtlMs: 1000})
				if g%4 == 3 {
					body = transport.Body{}
				}
				var err error
				for range 200 {
					if err = a.SendEncoded(ctx, "b", rcpt, wire, body); !errors.Is(err, transport.ErrQueueFull) {
						break
					}
					var qf *transport.QueueFullError
					if errors.As(err, &qf) && qf.Unit == "bytes" {
						byBytes.Add(1)
					}
					runtime.Gosched()
				}
				switch {
				case err == nil:
					ok.Add(1)
				case !errors.Is(err, transport.ErrQueueFull):
					t.Errorf("send: %v", err)
				}
				clear(wire)
			}
		})
	}
	wg.Wait()
	waitCond(t, 30*time.Second, "every accepted envelope at b", func() bool { return got.Load() == ok.Load() })
	if v := bad.Load(); v != nil {
		t.Fatalf("b received an envelope with the wrong type: %v", v)
	}
	waitCond(t, 15*time.Second, "the queue empty", func() bool {
		frames, bytes := transport.Queued(a.Transport, "b")
		return frames == 0 && bytes == 0
	})
	t.Logf("%d of %d accepted, %d refusals by bytes", ok.Load(), 16*300, byBytes.Load())
}

// Runs of whole envelopes (RequestBatch, as the outbox emits them) of
// many types share a small queue with single sends: a run the byte bound
// refuses is refused whole and leaves no name behind, so every envelope b
// gets has the type its value says, each accepted run arrives whole, and
// the queue drains to nothing.
func TestRunsOfNamedEnvelopesShareASmallQueue(t *testing.T) {
	a, got, bad := typeCheckingPair(t, 64)
	runsShareASmallQueue(t, a, got, bad, func(g, i, j int, rcpt string) *pb.Envelope {
		// New types all along (one more every run, 62 in all: within the
		// names bound), while the queue is contended.
		k := i + j%3
		url := typeURL(k)
		if k%20 == 0 {
			url += strings.Repeat("L", 600) // long ones too
		}
		return &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("m-%d-%d-%d", g, i, j), Sender: "@a", Recipient: rcpt,
			Body: &anypb.Any{TypeUrl: url, Value: []byte(url + "|" + strings.Repeat("x", (i*379+j*97)%9000))}, Receipt: pb.Envelope_RECEIPT_PROCESSED}
	})
}

// runsShareASmallQueue has 8 goroutines send 60 runs each of 1 to 30
// envelopes (envelope(g, i, j, rcpt) the j-th of goroutine g's i-th run),
// as RequestBatch does, and some single ones as Send, to b through a's
// small queue, sending each again while the queue refuses it. Every
// envelope b gets must be what its value says (typeCheckingPair), every
// accepted run arrive whole, some runs be refused, and the queue drain
// to nothing.
func runsShareASmallQueue(t *testing.T, a *node, got *atomic.Int64, bad *atomic.Value, envelope func(g, i, j int, rcpt string) *pb.Envelope) {
	t.Helper()
	ctx := ctxT(t, 90*time.Second)
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := range 60 {
				rcpt := fmt.Sprintf("r%d@b", (g+i)%3)
				run := make([]*pb.Envelope, 1+(g*13+i*7)%30)
				for j := range run {
					run[j] = envelope(g, i, j, rcpt)
				}
				single := g%2 == 1 && len(run) == 1
				if single {
					run[0].Receipt = pb.Envelope_RECEIPT_NONE
				}
				var err error
				for range 200 {
					if single {
						err = a.Send(ctx, "b", run[0]) // a single send among the runs
					} else {
						_, err = a.RequestBatch(ctx, "b", run)
					}
					if !errors.Is(err, transport.ErrQueueFull) {
						break
					}
					refused.Add(1)
					runtime.Gosched()
				}
				switch {
				case err == nil:
					ok.Add(int64(len(run)))
				case !errors.Is(err, transport.ErrQueueFull):
					t.Errorf("send: %v", err)
				}
			}
		})
	}
	wg.Wait()
	waitCond(t, 30*time.Second, "every accepted envelope at b", func() bool { return got.Load() >= ok.Load() })
	if v := bad.Load(); v != nil {
		t.Fatalf("b received an envelope not as sent: %v", v)
	}
	if got.Load() != ok.Load() {
		t.Fatalf("b got %d envelopes, %d were accepted: a refused run was partly sent", got.Load(), ok.Load())
	}
	waitCond(t, 15*time.Second, "the queue empty", func() bool {
		frames, bytes := transport.Queued(a.Transport, "b")
		return frames == 0 && bytes == 0
	})
	if refused.Load() == 0 {
		t.Fatal("no run was refused: the test did not fill the queue")
	}
	t.Logf("%d envelopes accepted, %d refusals", ok.Load(), refused.Load())
}

// Frames whose shape the fast path does not take (the body type before
// the envelope, twice, past 32 bits, the body's Any with an unknown field,
// the envelope split in two fields) are read as proto.Unmarshal reads
// them, and the names apply to what it reads.
func TestNamedFramesOfEveryShapeReadAsProtoReadsThem(t *testing.T) {
	envBytes := func(id string, body []byte) []byte {
		e, err := proto.Marshal(&pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: id, Sender: "@evil", Recipient: "x@srv"})
		if err != nil {
			t.Fatal(err)
		}
		if body != nil {
			e = protowire.AppendTag(e, 10, protowire.BytesType)
			e = protowire.AppendBytes(e, body)
		}
		return e
	}
	val := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), []byte("v"))
	withUnknown := protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), val...), 9, protowire.VarintType), 7)
	envF := func(e []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), e)
	}
	bt := func(v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, 6, protowire.VarintType), v)
	}
	frame := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return protowire.AppendBytes(nil, b)
	}
	name := func(ref uint32, url string) []byte {
		b, err := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_TypeName{TypeName: &pb.TypeName{Ref: ref, Url: url}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ca, srv, good, rec := hostileSetup(t, nil)
	evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
	s := evil.Lane(t)
	stream := [][]byte{
		name(1, "t/a"), name(2, "t/b"),
		frame(bt(2), envF(envBytes("before", val))),                         // body type first: t/b
		frame(envF(envBytes("twice", val)), bt(1), bt(2)),                   // last wins: t/b
		frame(envF(envBytes("wide", val)), bt(1<<32|1)),                     // uint32 truncation: t/a
		frame(envF(envBytes("unknown", withUnknown)), bt(1)),                // Any with an unknown field: t/a
		frame(envF(envBytes("split", nil)), bt(2), envF(envBytes("", val))), // envelope merged: t/b
	}
	want := []string{"before:t/b", "twice:t/b", "wide:t/a", "unknown:t/a", "split:t/b"}
	for _, b := range stream {
		if _, err := s.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	waitCond(t, 5*time.Second, "evil's envelopes", func() bool { return rec.count.Load() >= int64(1+len(want)) })
	got, _ := rec.snapshot()
	var gotS []string
	for _, e := range got[1:] {
		gotS = append(gotS, e.GetMsgId()+":"+e.GetBody().GetTypeUrl())
	}
	if fmt.Sprint(gotS) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", gotS, want)
	}
	if b := got[4].GetBody(); len(b.ProtoReflect().GetUnknown()) == 0 || !proto.Equal(&anypb.Any{TypeUrl: "t/a", Value: []byte("v")}, &anypb.Any{TypeUrl: b.TypeUrl, Value: b.Value}) {
		t.Fatalf("unknown: body %v", b)
	}
	assertGoodPeerWorks(t, srv, good)
}

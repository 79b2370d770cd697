package node_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/rawpeer"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A tell or an ask is reused (its envelope, and but for a remote ask its
// Message) once its handler returns, as is a remote ask's response once
// Ask has read it. What a handler read stays as it was while later
// messages reuse the memory: the id, the headers map and a header's value,
// the body's bytes (from a peer), a decoded copy; and every asker gets its
// own reply.
func TestValuesOutliveTheirMessage(t *testing.T) {
	for _, ask := range []bool{false, true} {
		for _, local := range []bool{false, true} {
			name := map[bool]string{false: "tell", true: "ask"}[ask] + map[bool]string{false: "/remote", true: "/local"}[local]
			t.Run(name, func(t *testing.T) { checkValuesOutliveTheirMessage(t, ask, local) })
		}
	}
}

func checkValuesOutliveTheirMessage(t *testing.T, ask, local bool) {
	nodes := cluster(t, 2)
	from := nodes[0]
	if local {
		from = nodes[1]
	}
	type kept struct {
		id, header, value string
		headers           map[string]string
		body              []byte
	}
	var mu sync.Mutex
	var got []kept
	to, err := nodes[1].Spawn("keep", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, kept{id: m.ID(), header: m.Headers()["n"], value: v.GetValue(), headers: m.Headers(), body: m.Envelope().GetBody().GetValue()})
		return wrapperspb.String("re " + v.GetValue()), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	const batches, per = 20, 100
	for b := range batches {
		var wg sync.WaitGroup
		for i := range per {
			n := fmt.Sprint(b*per + i)
			opt := node.WithHeaders(map[string]string{"n": n})
			if !ask {
				if err := from.Tell(context.Background(), to, wrapperspb.String(n), opt); err != nil {
					t.Fatal(err)
				}
				continue
			}
			wg.Go(func() {
				var re wrapperspb.StringValue
				if err := from.Ask(context.Background(), to, wrapperspb.String(n), &re, opt); err != nil {
					t.Error(err)
				} else if re.GetValue() != "re "+n {
					t.Errorf("ask %s got the reply %q", n, re.GetValue())
				}
			})
		}
		wg.Wait()
		// A mailbox holds the batch: none is dropped for room.
		testutil.WaitFor(t, 10*time.Second, "the batch handled", func() bool { return count() == (b+1)*per })
	}
	mu.Lock()
	defer mu.Unlock()
	ids := make(map[string]bool)
	for i, k := range got {
		want, err := proto.Marshal(wrapperspb.String(k.value))
		if err != nil {
			t.Fatal(err)
		}
		if local {
			want = nil // the sender's value, not bytes
		}
		if k.id == "" || ids[k.id] || k.header != k.value || k.headers["n"] != k.value || len(k.headers) != 1 || !bytes.Equal(k.body, want) {
			t.Fatalf("message %d: what its handler kept changed after it returned: id %q (seen before %v), header %q, headers %v, body % x; value %q",
				i, k.id, ids[k.id], k.header, k.headers, k.body, k.value)
		}
		ids[k.id] = true
	}
}

// tracedPair starts n1 and n2 with edit applied to both, joined.
func tracedPair(t *testing.T, edit func(*node.Config)) (*node.Node, *node.Node) {
	t.Helper()
	n1 := startNodeWith(t, "n1", filepath.Join(t.TempDir(), "n1"), edit)
	n2 := startNodeWith(t, "n2", filepath.Join(t.TempDir(), "n2"), edit, n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	return n1, n2
}

// checkMsg verifies within the handler that the message is whole: its id,
// header and body agree (the sender sets header n=k, body "v"+k, and a
// second header id=k).
func checkMsg(m *node.Message) (string, error) {
	var v wrapperspb.StringValue
	if err := m.Decode(&v); err != nil {
		return "", err
	}
	h := m.Headers()
	if "v"+h["n"] != v.GetValue() || h["n"] != h["id"] || m.ID() == "" {
		return "", fmt.Errorf("torn message: id %q headers %v body %q", m.ID(), h, v.GetValue())
	}
	return h["n"], nil
}

// Reuse holds on every path a tell or an ask from a peer takes: remote tells
// with TTLs that expire in the mailbox, DropOldest and DropNewest
// mailboxes, asks whose handlers fail, panic, answer too large, or are slow
// past the ask's deadline, with tracing and debug logging on; every
// handler checks its message is whole and every asker its reply.
func TestReuseOnEveryPath(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	const maxFrame = 64 << 10 // a reply past it is too large; smaller than the default, so the test allocates less
	n1, n2 := tracedPair(t, func(c *node.Config) {
		c.TracerProvider = tp
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.Transport.MaxFrameSize = maxFrame
	})
	var torn atomic.Int64
	var firstTorn atomic.Pointer[string]
	noteTorn := func(err error) {
		torn.Add(1)
		s := err.Error()
		firstTorn.CompareAndSwap(nil, &s)
	}
	handler := func(slow time.Duration) node.Handler {
		return func(ctx context.Context, m *node.Message) (proto.Message, error) {
			k, err := checkMsg(m)
			if err != nil {
				noteTorn(err)
				return nil, node.Permanent(err)
			}
			i, err := strconv.Atoi(k)
			if err != nil {
				return nil, node.Permanent(err)
			}
			if slow > 0 {
				time.Sleep(slow)
			}
			switch {
			case i%13 == 0:
				panic("boom " + k)
			case i%7 == 0:
				return nil, errors.New("fail " + k)
			case i%11 == 0:
				return wrapperspb.String(strings.Repeat("x", maxFrame+1)), nil // too large for a frame
			}
			return wrapperspb.String("re v" + k), nil
		}
	}
	for _, a := range []struct {
		name string
		opts []node.SpawnOption
		slow time.Duration
	}{
		{"plain", nil, 0},
		{"oldest", []node.SpawnOption{node.WithMailbox(2, mailbox.DropOldest)}, 200 * time.Microsecond},
		{"newest", []node.SpawnOption{node.WithMailbox(2, mailbox.DropNewest)}, 200 * time.Microsecond},
		{"slow", nil, 2 * time.Millisecond},
	} {
		if _, err := n2.Spawn(a.name, handler(a.slow), a.opts...); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var bad, tooLarge atomic.Int64
	var firstBad atomic.Pointer[string]
	noteBad := func(s string) {
		bad.Add(1)
		firstBad.CompareAndSwap(nil, &s)
	}
	for w := range 8 {
		wg.Go(func() {
			for j := range 300 {
				i := w*1000 + j
				k := fmt.Sprint(i)
				actor := []string{"plain", "oldest", "newest", "slow"}[i%4]
				to := node.Addr(actor, "n2")
				opt := node.WithHeaders(map[string]string{"n": k, "id": k})
				if j%2 == 0 {
					// A tell, some with a deadline that runs out in the mailbox.
					ctx := context.Background()
					var cancel context.CancelFunc = func() {}
					if j%4 == 0 {
						ctx, cancel = context.WithTimeout(ctx, time.Millisecond)
					}
					_ = n1.Tell(ctx, to, wrapperspb.String("v"+k), opt)
					cancel()
					continue
				}
				timeout := time.Second
				if j%3 == 0 {
					timeout = time.Millisecond // the response comes after the ask gave up
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				var re wrapperspb.StringValue
				err := n1.Ask(ctx, to, wrapperspb.String("v"+k), &re, opt)
				cancel()
				if err == nil {
					if re.GetValue() != "re v"+k {
						noteBad(fmt.Sprintf("ask %s got %.60q (len %d)", k, re.GetValue(), len(re.GetValue())))
					}
					continue
				}
				var re2 *node.RemoteError
				if errors.As(err, &re2) && strings.Contains(re2.Message, "reply too large for the wire") {
					tooLarge.Add(1)
				}
				if errors.As(err, &re2) && strings.Contains(re2.Message, "fail ") && !strings.Contains(re2.Message, "fail "+k) {
					noteBad(fmt.Sprintf("ask %s got another's error: %v", k, err))
				}
				if strings.Contains(err.Error(), "torn") {
					noteBad(fmt.Sprintf("ask %s: %v", k, err))
				}
			}
		})
	}
	wg.Wait()
	if n := torn.Load(); n > 0 {
		t.Errorf("%d handlers saw a torn message; first: %s", n, *firstTorn.Load())
	}
	if n := bad.Load(); n > 0 {
		t.Errorf("%d asks got a wrong outcome; first: %s", n, *firstBad.Load())
	}
	if tooLarge.Load() == 0 {
		t.Error("no ask heard that its reply was too large: that path was not taken")
	}
}

// Tells that the fast decoder hands to proto.Unmarshal (an unknown field)
// are recycled into the same pool as the fast ones; interleaved, every
// handler still sees its own message whole.
func TestReuseOfFallbackDecodedTells(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	var got, torn atomic.Int64
	const total = 2000
	// A mailbox that holds them all: on a loaded machine the handler may
	// fall behind the sender, and a tell refused for room is not sent again.
	if _, err := n.Spawn("keep", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		if _, err := checkMsg(m); err != nil {
			torn.Add(1)
			return nil, err
		}
		if m.Envelope().GetRpc().GetService() != "svc"+m.Headers()["n"] {
			torn.Add(1)
		}
		got.Add(1)
		return nil, nil
	}, node.WithMailbox(total, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	evil := rawpeer.Dial(t, testCA(t), "evil", target(n))
	lane := evil.Lane(t)
	for i := range total {
		k := fmt.Sprint(i)
		env := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "m" + k, Sender: "@evil", Recipient: "keep@n1",
			Headers: map[string]string{"n": k, "id": k}, Body: strBody(t, "v"+k),
			Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_EVENT, Service: "svc" + k}}
		if i%3 == 0 {
			env.ProtoReflect().SetUnknown(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), []byte("x")))
		}
		evil.Send(t, lane, env)
	}
	testutil.WaitFor(t, 20*time.Second, "all handled", func() bool { return got.Load()+torn.Load() == total })
	if torn.Load() > 0 {
		t.Fatalf("%d torn messages", torn.Load())
	}
}

package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// clusterWith is cluster with a config edit per node (i is its index).
func clusterWith(tb testing.TB, k int, edit func(i int, cfg *node.Config)) []*node.Node {
	tb.Helper()
	nodes := make([]*node.Node, k)
	for i := range nodes {
		var join []string
		if i > 0 {
			join = []string{nodes[0].GossipAddr()}
		}
		nodes[i] = startNodeWith(tb, nodeName(i), filepath.Join(tb.TempDir(), nodeName(i)), func(cfg *node.Config) { edit(i, cfg) }, join...)
	}
	waitAlive(tb, nodes, k)
	return nodes
}

type ctxKey struct{}

// seen is what a handler saw of its context and message.
type seen struct {
	deadline time.Time
	hasDL    bool
	value    any
	header   string
}

// TestHandlerContextCarriesCallersDeadlineAndValues: a handler's context
// ends at its caller's deadline, on this node and across the wire (as the
// time left), for tell and ask; on this node it also carries the caller's
// values, and on another node the values an interceptor pair carries in
// headers. Headers given with WithHeaders reach the handler either way.
func TestHandlerContextCarriesCallersDeadlineAndValues(t *testing.T) {
	const header = "x-tenant"
	// The client interceptor writes the context value into a header; the
	// server interceptor puts it back into the handler's context.
	toHeader := func(ctx context.Context, c *node.Call, next node.Invoker) error {
		if v, ok := ctx.Value(ctxKey{}).(string); ok {
			c.SetHeader(header, v)
		}
		return next(ctx, c)
	}
	fromHeader := func(ctx context.Context, m *node.Message, next node.Handler) (proto.Message, error) {
		if v, ok := m.Headers()[header]; ok && ctx.Value(ctxKey{}) == nil {
			ctx = context.WithValue(ctx, ctxKey{}, v)
		}
		return next(ctx, m)
	}
	nodes := clusterWith(t, 2, func(_ int, cfg *node.Config) {
		cfg.ClientInterceptors = []node.ClientInterceptor{toHeader}
		cfg.ServerInterceptors = []node.ServerInterceptor{fromHeader}
	})
	got := make(chan seen, 1)
	for _, n := range nodes {
		if _, err := n.Spawn("probe", func(ctx context.Context, m *node.Message) (proto.Message, error) {
			dl, ok := ctx.Deadline()
			got <- seen{deadline: dl, hasDL: ok, value: ctx.Value(ctxKey{}), header: m.Headers()["x-app"]}
			return wrapperspb.String("ok"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		to    node.Address
		kind  string
		slack time.Duration // how far from the caller's the handler's deadline may be
		late  time.Duration // how much later it may be (the transit is not subtracted)
	}{
		{"local tell", node.Addr("probe", nodes[0].Name()), "tell", 2 * time.Millisecond, time.Millisecond},
		{"local ask", node.Addr("probe", nodes[0].Name()), "ask", 2 * time.Millisecond, time.Millisecond},
		// The first message to a peer dials it after its time left was taken.
		{"remote tell", node.Addr("probe", nodes[1].Name()), "tell", 500 * time.Millisecond, 200 * time.Millisecond},
		{"remote ask", node.Addr("probe", nodes[1].Name()), "ask", 500 * time.Millisecond, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, "acme"), 7*time.Second)
			defer cancel()
			want, _ := ctx.Deadline()
			opt := node.WithHeaders(map[string]string{"x-app": "v1"})
			var err error
			if tc.kind == "tell" {
				err = nodes[0].Tell(ctx, tc.to, wrapperspb.String("hi"), opt)
			} else {
				err = nodes[0].Ask(ctx, tc.to, wrapperspb.String("hi"), nil, opt)
			}
			if err != nil {
				t.Fatal(err)
			}
			var s seen
			select {
			case s = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("handler did not run")
			}
			if !s.hasDL {
				t.Fatal("handler's context has no deadline")
			}
			if s.deadline.After(want.Add(tc.late)) || s.deadline.Before(want.Add(-tc.slack)) {
				t.Errorf("handler's deadline %v, caller's %v (slack %v)", s.deadline, want, tc.slack)
			}
			if s.value != "acme" {
				t.Errorf("handler's context value = %v, want acme", s.value)
			}
			if s.header != "v1" {
				t.Errorf("header x-app = %q, want v1", s.header)
			}
		})
	}
}

// TestTellNotCanceledWithCaller: a local tell's handler keeps running when
// the caller cancels its context after Tell returned.
func TestTellNotCanceledWithCaller(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	release, done := make(chan struct{}), make(chan error, 1)
	n.Spawn("slow", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		<-release
		done <- ctx.Err()
		return nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	if err := n.Tell(ctx, node.Addr("slow", "n1"), wrapperspb.String("x")); err != nil {
		t.Fatal(err)
	}
	cancel()
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("handler's context ended with its caller's: %v", err)
	}
}

// TestCallerDeadlinePassedInMailbox: a tell whose caller's deadline passes
// while it waits in the mailbox is not run, and is counted.
func TestCallerDeadlinePassedInMailbox(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	release := make(chan struct{})
	var mu sync.Mutex
	var ran []string
	n.Spawn("a", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var s wrapperspb.StringValue
		_ = m.Decode(&s)
		if s.GetValue() == "block" {
			<-release
		}
		mu.Lock()
		ran = append(ran, s.GetValue())
		mu.Unlock()
		return nil, nil
	})
	to := node.Addr("a", "n1")
	if err := n.Tell(context.Background(), to, wrapperspb.String("block")); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := n.Tell(short, to, wrapperspb.String("late")); err != nil {
		t.Fatal(err)
	}
	<-short.Done()
	close(release)
	testutil.WaitFor(t, 5*time.Second, "expired tell counted", func() bool { return n.Stats().Expired == 1 })
	if err := n.Tell(context.Background(), to, wrapperspb.String("after")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "later tell handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(ran, []string{"block", "after"}) {
		t.Fatalf("ran %v, want [block after]", ran)
	}
}

// TestInterceptorsRunInOrder: client interceptors run on the caller, the
// first outermost, around every kind of send; server interceptors on the
// receiver, the first outermost, around the handler.
func TestInterceptorsRunInOrder(t *testing.T) {
	var mu sync.Mutex
	var trail []string
	note := func(s string) {
		mu.Lock()
		trail = append(trail, s)
		mu.Unlock()
	}
	client := func(name string) node.ClientInterceptor {
		return func(ctx context.Context, c *node.Call, next node.Invoker) error {
			note(name + ">" + c.Kind.String())
			err := next(ctx, c)
			note("<" + name)
			return err
		}
	}
	server := func(name string) node.ServerInterceptor {
		return func(ctx context.Context, m *node.Message, next node.Handler) (proto.Message, error) {
			note(name + ">")
			r, err := next(ctx, m)
			note("<" + name)
			return r, err
		}
	}
	nodes := clusterWith(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.ClientInterceptors = []node.ClientInterceptor{client("A"), client("B")}
		} else {
			cfg.ServerInterceptors = []node.ServerInterceptor{server("X"), server("Y")}
		}
	})
	handled := make(chan struct{}, 3)
	nodes[1].Spawn("h", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		note("handler")
		handled <- struct{}{}
		return wrapperspb.String("r"), nil
	})
	ctx := ctxT(t)
	to := node.Addr("h", nodes[1].Name())
	for _, kind := range []string{"ask", "tell", "reliable"} {
		mu.Lock()
		trail = nil
		mu.Unlock()
		var err error
		switch kind {
		case "ask":
			err = nodes[0].Ask(ctx, to, wrapperspb.String("x"), nil)
		case "tell":
			err = nodes[0].Tell(ctx, to, wrapperspb.String("x"))
		case "reliable":
			_, err = nodes[0].TellReliable(ctx, to, wrapperspb.String("x"))
		}
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		<-handled
		want := []string{"A>" + kind, "B>" + kind, "X>", "Y>", "handler", "<Y", "<X", "<B", "<A"}
		testutil.WaitFor(t, 5*time.Second, kind+": trail complete", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(trail) == len(want)
		})
		mu.Lock()
		got := slices.Clone(trail)
		mu.Unlock()
		// The client's side and the server's run concurrently except for an
		// ask, which waits for the handler; compare each side's order.
		side := func(tr []string, client bool) []string {
			var out []string
			for _, s := range tr {
				if strings.ContainsAny(s, "AB") == client { // A and B are the client's
					out = append(out, s)
				}
			}
			return out
		}
		if kind == "ask" && !slices.Equal(got, want) {
			t.Errorf("ask: trail %v, want %v", got, want)
		}
		if c, w := side(got, true), side(want, true); !slices.Equal(c, w) {
			t.Errorf("%s: client side %v, want %v", kind, c, w)
		}
		if s, w := side(got, false), side(want, false); !slices.Equal(s, w) {
			t.Errorf("%s: server side %v, want %v", kind, s, w)
		}
	}
}

// TestInterceptorCanRefuse: a client interceptor that returns an error
// without calling next sends nothing, and its error is the send's.
func TestInterceptorCanRefuse(t *testing.T) {
	errDenied := errors.New("denied")
	n := startNodeWith(t, "n1", t.TempDir(), func(cfg *node.Config) {
		cfg.ClientInterceptors = []node.ClientInterceptor{func(ctx context.Context, c *node.Call, next node.Invoker) error {
			if c.Headers["token"] != "ok" {
				return errDenied
			}
			return next(ctx, c)
		}}
	})
	var ran sync.WaitGroup
	ran.Add(1)
	n.Spawn("a", func(ctx context.Context, m *node.Message) (proto.Message, error) { ran.Done(); return nil, nil })
	ctx := ctxT(t)
	if err := n.Tell(ctx, node.Addr("a", "n1"), wrapperspb.String("x")); !errors.Is(err, errDenied) {
		t.Fatalf("tell without token: %v, want denied", err)
	}
	if out, err := n.TellReliable(ctx, node.Addr("a", "n1"), wrapperspb.String("x")); !errors.Is(err, errDenied) || out != 0 {
		t.Fatalf("reliable without token: %v %v, want denied", out, err)
	}
	if err := n.Ask(ctx, node.Addr("a", "n1"), wrapperspb.String("x"), nil, node.WithHeaders(map[string]string{"token": "ok"})); err != nil {
		t.Fatal(err)
	}
	ran.Wait()
}

// TestReliableOptionsRefusedOnTellAndAsk: options that only mean something
// for a reliable send are ErrBadOption on Tell and Ask, before sending.
func TestReliableOptionsRefusedOnTellAndAsk(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	n.Spawn("a", echo)
	ctx := ctxT(t)
	to := node.Addr("a", "n1")
	for _, opt := range []node.SendOption{
		node.WithTTL(time.Second), node.WithIdempotencyKey("k"), node.WithOverwrite("k"),
		node.WithReplyTo(node.Addr("r", "n1")), node.WithCorrelationID("c"),
	} {
		if err := n.Tell(ctx, to, wrapperspb.String("x"), opt); !errors.Is(err, node.ErrBadOption) {
			t.Errorf("tell: %v, want ErrBadOption", err)
		}
		if err := n.Ask(ctx, to, wrapperspb.String("x"), nil, opt); !errors.Is(err, node.ErrBadOption) {
			t.Errorf("ask: %v, want ErrBadOption", err)
		}
	}
	if _, err := n.TellReliable(ctx, to, wrapperspb.String("x"), node.WithReplyTo(node.Addr("r", "elsewhere"))); !errors.Is(err, node.ErrBadOption) {
		t.Errorf("reply-to another node: %v, want ErrBadOption", err)
	}
	if _, err := n.TellReliable(ctx, to, wrapperspb.String("x"), node.WithCorrelationID("c")); !errors.Is(err, node.ErrBadOption) {
		t.Errorf("correlation id without reply-to: %v, want ErrBadOption", err)
	}
}

// TestTraceSpansTwoNodes: with a tracer provider on each node, an ask and
// a reliable send from n1 make a client span there and a handler span on
// n2 in the same trace, the handler's parent being the send's span.
func TestTraceSpansTwoNodes(t *testing.T) {
	recs := []*tracetest.SpanRecorder{tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()}
	tps := make([]*sdktrace.TracerProvider, 2)
	for i := range tps {
		tps[i] = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recs[i]))
		t.Cleanup(func() { _ = tps[i].Shutdown(context.Background()) })
	}
	nodes := clusterWith(t, 2, func(i int, cfg *node.Config) { cfg.TracerProvider = tps[i] })
	nodes[1].Spawn("h", echo)
	ctx := ctxT(t)
	to := node.Addr("h", nodes[1].Name())
	root, span := tps[0].Tracer("test").Start(ctx, "operation")
	if err := nodes[0].Ask(root, to, wrapperspb.String("x"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[0].TellReliable(root, to, wrapperspb.String("y")); err != nil {
		t.Fatal(err)
	}
	span.End()
	testutil.WaitFor(t, 5*time.Second, "two handler spans on n2", func() bool { return len(recs[1].Ended()) == 2 })
	client := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range recs[0].Ended() {
		client[s.Name()] = s
	}
	for _, kind := range []string{"ask", "reliable"} {
		cs, ok := client[kind+" h"]
		if !ok {
			t.Fatalf("no %s span on n1: %v", kind, spanNames(recs[0].Ended()))
		}
		if cs.Parent().SpanID() != span.SpanContext().SpanID() {
			t.Errorf("%s span's parent is not the caller's span", kind)
		}
		var found bool
		for _, ss := range recs[1].Ended() {
			if ss.Parent().SpanID() == cs.SpanContext().SpanID() {
				found = true
				if ss.SpanContext().TraceID() != span.SpanContext().TraceID() {
					t.Errorf("%s: handler span in trace %v, want %v", kind, ss.SpanContext().TraceID(), span.SpanContext().TraceID())
				}
				if want := map[string]trace.SpanKind{"ask": trace.SpanKindServer, "reliable": trace.SpanKindConsumer}[kind]; ss.SpanKind() != want {
					t.Errorf("%s: handler span kind %v, want %v", kind, ss.SpanKind(), want)
				}
			}
		}
		if !found {
			t.Errorf("%s: no handler span on n2 is a child of n1's span (n2 has %v)", kind, spanNames(recs[1].Ended()))
		}
	}
}

// TestNoTracingWithoutProvider: without a provider or propagator, nothing
// is added to a message's headers.
func TestNoTracingWithoutProvider(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	n := startNode(t, "n1", t.TempDir())
	headers := make(chan map[string]string, 1)
	n.Spawn("h", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		headers <- m.Headers()
		return nil, nil
	})
	ctx, span := tp.Tracer("test").Start(ctxT(t), "op")
	defer span.End()
	if err := n.Ask(ctx, node.Addr("h", "n1"), wrapperspb.String("x"), nil); err != nil {
		t.Fatal(err)
	}
	if h := <-headers; len(h) != 0 {
		t.Fatalf("headers %v, want none", h)
	}
}

func spanNames(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, fmt.Sprintf("%s(%v)", s.Name(), s.SpanKind()))
	}
	return out
}

package node

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var benchSink proto.Message

// benchSend stands for the send itself: a static call that keeps nothing,
// as n.tell is.
func benchSend(_ context.Context, c *Call) error {
	benchSink = c.Request
	return nil
}

// BenchmarkClientInterceptors measures what installed interceptors add to
// a send, apart from the send: Tell's path without interceptors (a Call on
// the stack, a static call) against the path with them (a Call on the
// heap, the chain). interceptors=1 minus interceptors=0 is the cost of one
// installed no-op interceptor per call.
func BenchmarkClientInterceptors(b *testing.B) {
	ctx := context.Background()
	msg := wrapperspb.String("x")
	to := Addr("a", "n1")
	noop := func(ctx context.Context, c *Call, next Invoker) error { return next(ctx, c) }
	n := &Node{}
	for _, k := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("interceptors=%d", k), func(b *testing.B) {
			invoke := chainClient(slices.Repeat([]ClientInterceptor{noop}, k), benchSend)
			b.ReportAllocs()
			for b.Loop() {
				if invoke == nil { // Tell's fast path
					c := Call{Kind: CallTell, To: to, Request: msg}
					_ = benchSend(ctx, &c)
					continue
				}
				c, _ := n.newCall(CallTell, to, msg, nil, nil)
				_ = invoke(ctx, c)
				putCall(c)
			}
		})
	}
}

// BenchmarkServerInterceptors: what installed server interceptors add to
// a handler run (the chain is composed once, at Spawn).
func BenchmarkServerInterceptors(b *testing.B) {
	ctx := context.Background()
	m := &Message{}
	h := func(ctx context.Context, m *Message) (proto.Message, error) { return nil, nil }
	noop := func(ctx context.Context, m *Message, next Handler) (proto.Message, error) { return next(ctx, m) }
	for _, k := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("interceptors=%d", k), func(b *testing.B) {
			chained := chainServer(slices.Repeat([]ServerInterceptor{noop}, k), h)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = chained(ctx, m)
			}
		})
	}
}

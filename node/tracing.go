package node

import (
	"context"

	"github.com/meshnode/meshnode/mailbox/pb"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/protobuf/proto"
)

// tracerName is the instrumentation scope of the node's spans.
const tracerName = "github.com/meshnode/meshnode/node"

// setupInterceptors composes the configured interceptors, with tracing
// outermost so that the others run inside its spans and see its context.
func (n *Node) setupInterceptors() {
	client := n.cfg.ClientInterceptors
	server := n.cfg.ServerInterceptors
	if t := newTracing(n.cfg.TracerProvider, n.cfg.Propagator); t != nil {
		client = append([]ClientInterceptor{t.client}, client...)
		server = append([]ServerInterceptor{t.server}, server...)
	}
	n.invoke = chainClient(client, n.send)
	n.serverInterceptors = server
}

// tracing makes a span per send and per handler run, and carries the
// trace context in the message headers (W3C traceparent and tracestate,
// and baggage, by default).
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// newTracing returns nil when neither a provider nor a propagator is set:
// then nothing is added to a send or a handler run. A propagator alone
// passes trace context through without spans of this node's own.
func newTracing(tp trace.TracerProvider, prop propagation.TextMapPropagator) *tracing {
	if tp == nil && prop == nil {
		return nil
	}
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	if prop == nil {
		prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return &tracing{tracer: tp.Tracer(tracerName), prop: prop}
}

// spanName is "service/method" for a typed call, else "kind actor".
func spanName(kind, service, method, actor string) string {
	if service != "" || method != "" {
		return service + "/" + method
	}
	return kind + " " + actor
}

func (t *tracing) client(ctx context.Context, c *Call, next Invoker) error {
	kind := trace.SpanKindProducer
	if c.Kind == CallAsk {
		kind = trace.SpanKindClient
	}
	ctx, span := t.tracer.Start(ctx, spanName(c.Kind.String(), c.Service, c.Method, c.To.Actor),
		trace.WithSpanKind(kind), trace.WithAttributes(
			attribute.String("rpc.system", "meshnode"),
			attribute.String("meshnode.send", c.Kind.String()),
			attribute.String("meshnode.recipient", c.To.String()),
		))
	defer span.End()
	if c.Service != "" {
		span.SetAttributes(attribute.String("rpc.service", c.Service), attribute.String("rpc.method", c.Method))
	}
	t.prop.Inject(ctx, callCarrier{c})
	err := next(ctx, c)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else if c.Kind == CallReliable {
		span.SetAttributes(attribute.String("meshnode.outcome", c.Outcome.String()))
	}
	return err
}

func (t *tracing) server(ctx context.Context, m *Message, next Handler) (proto.Message, error) {
	ctx = t.prop.Extract(ctx, propagation.MapCarrier(m.Headers()))
	kind, send := trace.SpanKindConsumer, CallTell.String()
	switch {
	case m.Sequence() > 0:
		send = CallReliable.String()
	case m.env.GetRpc().GetKind() == pb.RpcMeta_REQUEST:
		kind, send = trace.SpanKindServer, CallAsk.String()
	}
	service, method := m.Service(), m.Method()
	ctx, span := t.tracer.Start(ctx, spanName("handle", service, method, m.Recipient().Actor),
		trace.WithSpanKind(kind), trace.WithAttributes(
			attribute.String("rpc.system", "meshnode"),
			attribute.String("meshnode.send", send),
			attribute.String("meshnode.sender", m.Sender().String()),
			attribute.String("meshnode.recipient", m.Recipient().String()),
		))
	defer span.End()
	if service != "" {
		span.SetAttributes(attribute.String("rpc.service", service), attribute.String("rpc.method", method))
	}
	reply, err := next(ctx, m)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return reply, err
}

// callCarrier writes a propagator's fields into a call's headers.
type callCarrier struct{ c *Call }

func (cc callCarrier) Get(key string) string { return cc.c.Headers[key] }
func (cc callCarrier) Set(key, value string) { cc.c.SetHeader(key, value) }
func (cc callCarrier) Keys() []string {
	keys := make([]string, 0, len(cc.c.Headers))
	for k := range cc.c.Headers {
		keys = append(keys, k)
	}
	return keys
}

package mailbox

import (
	"context"
	"fmt"
	"sync"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
)

// HandlerFunc handles one request envelope and returns the reply body (nil
// for none) or an error (wrap it with Permanent to mark it poison).
type HandlerFunc func(ctx context.Context, env *pb.Envelope) (proto.Message, error)

type route struct{ service, method string }

// ServeMux routes envelopes by (env.Rpc.Service, env.Rpc.Method) to
// handlers. Safe for concurrent use; routes may be added while serving.
type ServeMux struct {
	// mu guards the fields below.
	mu     sync.RWMutex
	routes map[route]HandlerFunc
}

// NewServeMux returns an empty mux.
func NewServeMux() *ServeMux {
	return &ServeMux{routes: make(map[route]HandlerFunc)}
}

// Handle registers h for (service, method), replacing an existing route.
// A nil h removes the route.
func (m *ServeMux) Handle(service, method string, h HandlerFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h == nil {
		delete(m.routes, route{service, method})
		return
	}
	m.routes[route{service, method}] = h
}

// HandleTyped registers h for (service, method). The envelope body (an
// anypb.Any) is decoded into a new Req before h is called; a missing body,
// a body of another type or undecodable bytes give Permanent(error wrapping
// ErrBadBody): a poison message, not retried.
func HandleTyped[Req any, PReq interface {
	*Req
	proto.Message
}](m *ServeMux, service, method string, h func(ctx context.Context, req PReq) (proto.Message, error)) {
	m.Handle(service, method, func(ctx context.Context, env *pb.Envelope) (proto.Message, error) {
		body := env.GetBody()
		if body == nil {
			return nil, Permanent(fmt.Errorf("mailbox: decode %s/%s: empty body: %w", service, method, ErrBadBody))
		}
		req := PReq(new(Req))
		if err := body.UnmarshalTo(req); err != nil {
			return nil, Permanent(fmt.Errorf("mailbox: decode %s/%s body %q: %w: %w", service, method, body.GetTypeUrl(), ErrBadBody, err))
		}
		return h(ctx, req)
	})
}

// Serve routes env to its handler. An unknown (service, method) gives
// Permanent(error wrapping ErrNoHandler). A handler panic is recovered and
// returned as Permanent(error wrapping ErrPanicked).
func (m *ServeMux) Serve(ctx context.Context, env *pb.Envelope) (reply proto.Message, err error) {
	svc, meth := env.GetRpc().GetService(), env.GetRpc().GetMethod()
	m.mu.RLock()
	h, ok := m.routes[route{svc, meth}]
	m.mu.RUnlock()
	if !ok {
		return nil, Permanent(fmt.Errorf("mailbox: serve %q/%q: %w", svc, meth, ErrNoHandler))
	}
	defer func() {
		if r := recover(); r != nil {
			reply, err = nil, Permanent(fmt.Errorf("mailbox: serve %q/%q: %w: %v", svc, meth, ErrPanicked, r))
		}
	}()
	return h(ctx, env)
}

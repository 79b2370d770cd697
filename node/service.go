package node

import (
	"context"
	"fmt"
	"sync"

	"github.com/meshnode/meshnode/mailbox"
	"google.golang.org/protobuf/proto"
)

// ServiceMux routes the messages of an actor to handlers by the (service,
// method) they call (WithMethod; generated clients set it). Register
// services on it with the generated RegisterXxxServer functions and spawn
// its Serve method as the actor's handler:
//
//	mux := node.NewServiceMux()
//	devicepb.RegisterDeviceCommandsServer(mux, impl)
//	n.Spawn("commands", mux.Serve)
//
// Safe for concurrent use; routes may be added while it serves.
type ServiceMux struct {
	// mu guards the field below.
	mu     sync.RWMutex
	routes map[methodKey]Handler
}

type methodKey struct{ service, method string }

// NewServiceMux returns a mux with no routes.
func NewServiceMux() *ServiceMux { return &ServiceMux{routes: make(map[methodKey]Handler)} }

// Handle routes (service, method) to h, replacing an earlier route; a nil
// h removes it.
func (x *ServiceMux) Handle(service, method string, h Handler) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h == nil {
		delete(x.routes, methodKey{service, method})
		return
	}
	x.routes[methodKey{service, method}] = h
}

// Serve is the actor's Handler: it runs the route of the message's
// (service, method). A message for no route fails with an
// *UnknownMethodError (errors.Is ErrUnknownMethod; across the wire a
// *RemoteError with code Unimplemented that errors.Is matches too), which
// is permanent: a reliable one is dead-lettered, not retried.
func (x *ServiceMux) Serve(ctx context.Context, m *Message) (proto.Message, error) {
	k := methodKey{m.Service(), m.Method()}
	x.mu.RLock()
	h := x.routes[k]
	x.mu.RUnlock()
	if h == nil {
		return nil, &UnknownMethodError{Service: k.service, Method: k.method}
	}
	return h(ctx, m)
}

// UnknownMethodError: the recipient serves no such (service, method).
type UnknownMethodError struct {
	Service, Method string
}

func (e *UnknownMethodError) Error() string {
	if e.Service == "" && e.Method == "" {
		return "node: message names no method (send it with WithMethod, or through a generated client)"
	}
	return fmt.Sprintf("node: unknown method %s/%s", e.Service, e.Method)
}

// Unwrap returns ErrUnknownMethod.
func (e *UnknownMethodError) Unwrap() error { return mailbox.ErrUnknownMethod }

package admin

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/metrics"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
)

// Backend is what the API needs from the running node: the sends, the
// dead-letter queue, and the snapshots /metrics reads (metrics.Source).
// NodeBackend adapts a *node.Node; tests use fakes.
type Backend interface {
	metrics.Source
	Tell(ctx context.Context, to node.Address, msg proto.Message) error
	Ask(ctx context.Context, to node.Address, req, resp proto.Message) error
	TellReliable(ctx context.Context, to node.Address, msg proto.Message, opts ...node.SendOption) (node.Outcome, error)
	DeadLetters(f outbox.DLQFilter) ([]outbox.DeadLetter, error)
	Replay(f outbox.DLQFilter) (int, error)
	Purge(f outbox.DLQFilter) (int, error)
}

// Inbox is the any-language inbox: the daemon's Declare also spawns the
// inbox's actor.
type Inbox interface {
	Declare(name string) (created bool, err error)
	Pull(ctx context.Context, name string, after uint64, max int, wait time.Duration) ([]*pb.Envelope, error)
	AckUpTo(name string, upTo uint64) (int, error)
	Stats() map[string]inbox.Stats
	// Err says why the inbox store stopped (a failed sync), nil while it
	// works.
	Err() error
}

// NodeBackend adapts a *node.Node to Backend.
type NodeBackend struct{ *node.Node }

// OutboxStats returns the node's outbox statistics.
func (b NodeBackend) OutboxStats() node.OutboxStats { return b.Outbox().Stats() }

// Tell is node.Tell without options (Backend predates them).
func (b NodeBackend) Tell(ctx context.Context, to node.Address, msg proto.Message) error {
	return b.Node.Tell(ctx, to, msg)
}

// Ask is node.Ask without options.
func (b NodeBackend) Ask(ctx context.Context, to node.Address, req, resp proto.Message) error {
	return b.Node.Ask(ctx, to, req, resp)
}

// DeadLetters lists the node's dead letters.
func (b NodeBackend) DeadLetters(f outbox.DLQFilter) ([]outbox.DeadLetter, error) {
	return b.Outbox().DeadLetters(f)
}

// Replay puts dead letters back into the node's outbox.
func (b NodeBackend) Replay(f outbox.DLQFilter) (int, error) { return b.Outbox().Replay(f) }

// Purge deletes dead letters.
func (b NodeBackend) Purge(f outbox.DLQFilter) (int, error) { return b.Outbox().Purge(f) }

// Config configures a Server.
type Config struct {
	Addr       string        // listen address; must be loopback unless Token and TLS are set (127.0.0.1:7948)
	Token      string        // bearer token every request must carry; "" = none (loopback only)
	TLS        *tls.Config   // serve HTTPS with it; required off loopback, so a token never crosses the network in clear (nil: HTTP)
	Backend    Backend       // the node (required)
	Inbox      Inbox         // the any-language inbox; nil disables /v1/inbox
	AskTimeout time.Duration // deadline of /v1/ask when the request names none (10 s)
	MaxBody    int64         // largest request body accepted (4 MiB, the frame limit)
	Logger     *slog.Logger  // request errors; nil discards

	// Metrics is the node's collector; the daemon shares it so its inbox
	// handlers are timed in the same registry. nil: New makes one.
	Metrics *metrics.Collector
	// Keyring applies a gossip keyring operation on every alive member; nil
	// answers /v1/keyring with an error.
	Keyring KeyringOp
	// Ready reports why the daemon is not ready yet (nil: ready); /readyz
	// answers 503 with that reason. nil: ready whenever the API is up.
	Ready func() error
	// Live reports why the daemon should be restarted (nil: it works);
	// /healthz answers 503 with that reason, so that an orchestrator's
	// liveness probe restarts it. nil: live while the API is up.
	Live func() error
	// Pprof serves net/http/pprof under /debug/pprof/ (false). Profiles
	// show internals and cost CPU: enable it while investigating.
	Pprof bool
}

// DefaultConfig returns a Config with every field set but Backend and Inbox.
func DefaultConfig() Config {
	return Config{
		Addr:       "127.0.0.1:7948",
		AskTimeout: 10 * time.Second,
		MaxBody:    4 << 20,
	}
}

// Validate reports the first problem with c, wrapped in ErrBadConfig.
func (c Config) Validate() error {
	if c.Backend == nil {
		return fmt.Errorf("%w: no backend", ErrBadConfig)
	}
	if c.AskTimeout <= 0 {
		return fmt.Errorf("%w: ask timeout must be positive", ErrBadConfig)
	}
	if c.MaxBody <= 0 {
		return fmt.Errorf("%w: max body must be positive", ErrBadConfig)
	}
	return CheckAddr(c.Addr, c.Token, c.TLS != nil)
}

// CheckAddr refuses an admin address that is not loopback unless a token
// protects it and TLS (tlsOn) keeps that token off the wire in clear.
func CheckAddr(addr, token string, tlsOn bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: admin address %q: %w", ErrBadConfig, addr, err)
	}
	switch {
	case IsLoopback(host):
		return nil
	case token == "":
		return fmt.Errorf("%w: admin address %q is not loopback: set admin_token (--admin-token) to expose it, or use 127.0.0.1", ErrBadConfig, addr)
	case !tlsOn:
		return fmt.Errorf("%w: admin address %q is not loopback: the admin API must be served over TLS there, so that its token is not sent in clear", ErrBadConfig, addr)
	}
	return nil
}

// IsLoopback reports whether host is "localhost" or a loopback IP; an empty
// host (all interfaces) is not.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/transport"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

func newRunCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run a node (the daemon) until SIGINT or SIGTERM",
		Long: `Runs a node: joins the cluster, serves the admin API, /metrics and the inbox
API on admin_addr, and on SIGINT or SIGTERM leaves the cluster gracefully,
flushes and exits 0.

Every setting comes from, in increasing precedence: its default, the TOML
file (--config), the environment (MESHNODE_<KEY>, e.g. MESHNODE_DATA_DIR)
and the flag. Unknown keys in the file are an error.`,
		Example: `  meshnode run --config /etc/meshnode/n1.toml
  meshnode run --name n1 --join 10.0.0.2:7946 --inboxes orders,alerts
  MESHNODE_DATA_DIR=/var/lib/meshnode meshnode run --name n1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := LoadConfig(cmd.Flags(), os.LookupEnv)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runDaemon(ctx, cfg, cmd.ErrOrStderr())
		},
	}
	addFlags(cmd.Flags())
	return cmd
}

func newLogger(cfg Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// nodeConfig turns the daemon's config into the node's, reading the files.
func nodeConfig(cfg Config, logger *slog.Logger) (node.Config, error) {
	nc := node.DefaultConfig(cfg.Name)
	nc.Cluster, nc.DataDir, nc.GossipAddr, nc.QUICAddr, nc.Join = cfg.Cluster, cfg.DataDir, cfg.GossipAddr, cfg.QUICAddr, cfg.Join
	nc.MailboxCapacity = cfg.MailboxCapacity
	nc.Logger = logger
	certFile, keyFile := cfg.certFiles()
	for _, f := range []struct{ what, path, fix string }{
		{"CA certificate", cfg.CAFile, "create it with `meshnode ca init`, or set --ca-file"},
		{"certificate", certFile, "create it with `meshnode cert issue --name " + cfg.Name + "`, or set --cert-file"},
		{"key", keyFile, "create it with `meshnode cert issue --name " + cfg.Name + "`, or set --key-file"},
	} {
		if _, err := os.Stat(f.path); err != nil {
			return nc, fmt.Errorf("%w: %s file %s: %w (%s)", errBadConfig, f.what, f.path, errors.Unwrap(err), f.fix)
		}
	}
	id, err := transport.LoadIdentityFiles(cfg.CAFile, certFile, keyFile)
	if err != nil {
		return nc, fmt.Errorf("%w: %w", errBadConfig, err)
	}
	if id.Name != "" && id.Name != cfg.Name {
		return nc, fmt.Errorf("%w: certificate %s is for %q but the node is named %q (issue one with `meshnode cert issue --name %s`)", errBadConfig, certFile, id.Name, cfg.Name, cfg.Name)
	}
	nc.TLS = id
	if cfg.GossipKeyFile != "" {
		if nc.GossipKey, err = readGossipKey(cfg.GossipKeyFile); err != nil {
			return nc, fmt.Errorf("%w: %w", errBadConfig, err)
		}
	}
	return nc, nil
}

// startError turns a start-up failure into a one-line message saying what to do.
func startError(cfg Config, what string, err error) error {
	switch {
	case errors.Is(err, outbox.ErrLocked), errors.Is(err, inbox.ErrLocked):
		return fmt.Errorf("data directory %s is used by another meshnode (stop it or use --data-dir)", cfg.DataDir)
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%s: address in use (is another meshnode running? choose other --gossip-addr / --quic-addr / --admin-addr): %w", what, err)
	case errors.Is(err, node.ErrBadConfig):
		return fmt.Errorf("%w: %w", errBadConfig, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// runDaemon runs a node until ctx ends, then shuts down gracefully.
func runDaemon(ctx context.Context, cfg Config, logw io.Writer) error {
	logger := newLogger(cfg, logw)
	nc, err := nodeConfig(cfg, logger)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data directory %s: %w", cfg.DataDir, err)
	}
	icfg := inbox.DefaultConfig(filepath.Join(cfg.DataDir, "inbox.db"))
	icfg.MaxMessages = cfg.InboxCapacity
	store, err := inbox.Open(icfg)
	if err != nil {
		return startError(cfg, "open inbox", err)
	}
	defer func() { _ = store.Close() }()

	l, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		return startError(cfg, "admin address "+cfg.AdminAddr, err)
	}
	// Open, spawn the inbox actors, then join: peers never see this node
	// without its inboxes.
	n, err := node.Open(nc)
	if err != nil {
		_ = l.Close()
		return startError(cfg, "start node", err)
	}
	defer func() {
		if err := n.Close(); err != nil {
			logger.Error("close node", "err", err)
		}
	}()

	boxes := &daemonInbox{Store: store, n: n, log: logger}
	for _, name := range append(store.Inboxes(), cfg.Inboxes...) {
		if _, err := boxes.Declare(name); err != nil {
			_ = l.Close()
			return fmt.Errorf("declare inbox %q: %w", name, err)
		}
	}
	if err := n.Start(ctx); err != nil {
		_ = l.Close()
		return startError(cfg, "start node", err)
	}
	acfg := admin.DefaultConfig()
	acfg.Addr, acfg.Token, acfg.Backend, acfg.Inbox, acfg.Logger = cfg.AdminAddr, cfg.AdminToken, admin.NodeBackend{Node: n}, boxes, logger
	srv, err := admin.New(acfg)
	if err != nil {
		_ = l.Close()
		return fmt.Errorf("%w: %w", errBadConfig, err)
	}
	srv.Serve(l)
	defer func() { _ = srv.Close() }()
	logger.Info("meshnode running", "name", cfg.Name, "cluster", cfg.Cluster, "gossip", n.GossipAddr(),
		"quic", n.QUICAddr(), "admin", l.Addr().String(), "inboxes", store.Inboxes())

	<-ctx.Done()
	logger.Info("shutting down: leaving the cluster and flushing")
	// Order: stop taking API requests, then leave and close the node (its
	// actors append to the inbox), then the inbox (deferred).
	_ = srv.Close()
	return nil
}

// daemonInbox is the admin API's Inbox: the store, plus an actor per inbox.
type daemonInbox struct {
	*inbox.Store
	n   *node.Node
	log *slog.Logger
}

// Declare creates the inbox durably and spawns its actor (idempotent).
func (d *daemonInbox) Declare(name string) (bool, error) {
	created, err := d.Store.Declare(name)
	if err != nil {
		return false, err
	}
	if _, err := d.n.Spawn(name, inboxHandler(d.Store, name)); err != nil && !errors.Is(err, node.ErrActorExists) {
		return created, fmt.Errorf("spawn inbox actor %q: %w", name, err)
	}
	if created {
		d.log.Info("inbox declared", "inbox", name)
	}
	return created, nil
}

// inboxRetryAfter is what a sender to a full inbox is told to wait.
const inboxRetryAfter = time.Second

// inboxHandler appends every message durably before returning, so a reliable
// sender is told Delivered only once the message is on disk. An ask gets
// {"inbox": name, "cursor": N}.
func inboxHandler(st *inbox.Store, name string) node.Handler {
	return func(ctx context.Context, m *node.Message) (proto.Message, error) {
		env := m.Envelope()
		if env.GetBody() == nil {
			// Local sends carry the value, not the wire bytes.
			if body, err := m.Body(); err == nil && body != nil {
				a, err := anypb.New(body)
				if err != nil {
					return nil, node.Permanent(fmt.Errorf("inbox %s: encode body: %w", name, err))
				}
				env = proto.CloneOf(env)
				env.Body = a
			}
		}
		cur, err := st.Append(ctx, name, env)
		if errors.Is(err, inbox.ErrFull) {
			return nil, fmt.Errorf("%w: %w", err, &node.CapacityError{RetryAfter: inboxRetryAfter})
		}
		if err != nil {
			return nil, err
		}
		return &structpb.Struct{Fields: map[string]*structpb.Value{
			"inbox":  structpb.NewStringValue(name),
			"cursor": structpb.NewNumberValue(float64(cur)),
		}}, nil
	}
}

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
	"github.com/meshnode/meshnode/internal/version"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/metrics"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/transport"
	"github.com/spf13/cobra"
)

func newRunCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run a node (the daemon) until SIGINT or SIGTERM; SIGHUP reloads",
		Long: `Runs a node: joins the cluster, serves the admin API, /metrics and the inbox
API on admin_addr, and on SIGINT or SIGTERM leaves the cluster gracefully,
flushes and exits 0.

SIGHUP re-reads the configuration (file, environment, flags) and applies what
can change without a restart: log_level, admin_token and the node's
certificate (presented on new connections). A new gossip key file is checked
and reported; it takes effect at the next start.

Under systemd (Type=notify) it reports READY=1 once it has joined the cluster
(or started alone when no seed answers within join_wait).

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
				return withCode(exitConfig, err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			reload := func() (Config, error) { return LoadConfig(cmd.Flags(), os.LookupEnv) }
			return withCode(exitConfig, runDaemon(ctx, cfg, cmd.ErrOrStderr(), hup, reload))
		},
	}
	addFlags(cmd.Flags())
	return cmd
}

// nodeConfig turns the daemon's config into the node's, reading the files.
func nodeConfig(cfg Config, logger *slog.Logger) (node.Config, error) {
	nc := node.DefaultConfig(cfg.Name)
	nc.Cluster, nc.DataDir, nc.GossipAddr, nc.QUICAddr, nc.Join = cfg.Cluster, cfg.DataDir, cfg.GossipAddr, cfg.QUICAddr, cfg.Join
	nc.MailboxCapacity = cfg.MailboxCapacity
	nc.Logger = logger
	keep, margin, err := cfg.retention()
	if err != nil {
		return nc, fmt.Errorf("%w: %w", errBadConfig, err)
	}
	nc.Outbox.StreamRetention, nc.Outbox.RetentionMargin = keep, margin
	if nc.Transport.FrameReadTimeout, err = cfg.frameReadTimeout(); err != nil {
		return nc, fmt.Errorf("%w: %w", errBadConfig, err)
	}
	nc.Transport.StreamWindow = cfg.StreamWindow
	id, err := loadIdentity(cfg)
	if err != nil {
		return nc, err
	}
	nc.TLS = id
	if cfg.GossipKeyFile != "" {
		if nc.GossipKey, err = readGossipKey(cfg.GossipKeyFile); err != nil {
			return nc, fmt.Errorf("%w: %w", errBadConfig, err)
		}
	}
	return nc, nil
}

// loadIdentity reads and checks the CA, certificate and key files.
func loadIdentity(cfg Config) (transport.Identity, error) {
	certFile, keyFile := cfg.certFiles()
	for _, f := range []struct{ what, path, fix string }{
		{"CA certificate", cfg.CAFile, "create it with meshnode ca init, or set --ca-file"},
		{"certificate", certFile, "create it with meshnode cert issue --name " + cfg.Name + ", or set --cert-file"},
		{"key", keyFile, "create it with meshnode cert issue --name " + cfg.Name + ", or set --key-file"},
	} {
		if _, err := os.Stat(f.path); err != nil {
			return transport.Identity{}, fmt.Errorf("%w: %s file %s: %w (%s)", errBadConfig, f.what, f.path, errors.Unwrap(err), f.fix)
		}
	}
	id, err := transport.LoadIdentityFiles(cfg.CAFile, certFile, keyFile)
	if err != nil {
		return id, fmt.Errorf("%w: %w", errBadConfig, err)
	}
	if id.Name != "" && id.Name != cfg.Name {
		return id, fmt.Errorf("%w: certificate %s is for %q but the node is named %q (issue one with meshnode cert issue --name %s)", errBadConfig, certFile, id.Name, cfg.Name, cfg.Name)
	}
	return id, nil
}

// startError turns a start-up failure into a one-line message saying what to do.
func startError(cfg Config, what string, err error) error {
	switch {
	case errors.Is(err, outbox.ErrLocked), errors.Is(err, inbox.ErrLocked):
		return fmt.Errorf("data directory %s is used by another meshnode (stop it or use --data-dir)", cfg.DataDir)
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%s: address in use (is another meshnode running? choose other --gossip-addr / --quic-addr / --admin-addr)", what)
	case errors.Is(err, node.ErrBadConfig):
		return fmt.Errorf("%w: %w", errBadConfig, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// checkBinds binds the gossip (TCP and UDP) and QUIC (UDP) addresses and
// lets them go, so that a port in use is reported as a bind of the setting
// that names it, before the node starts joining anything. (A port taken in
// between is still refused by the node, less clearly.)
func checkBinds(cfg Config) error {
	for _, b := range []struct{ setting, flag, network, addr string }{
		{"gossip_addr", "--gossip-addr", "tcp", cfg.GossipAddr},
		{"gossip_addr", "--gossip-addr", "udp", cfg.GossipAddr},
		{"quic_addr", "--quic-addr", "udp", cfg.QUICAddr},
	} {
		if _, port, _ := net.SplitHostPort(b.addr); port == "0" {
			continue
		}
		var err error
		if b.network == "tcp" {
			var l net.Listener
			if l, err = net.Listen("tcp", b.addr); err == nil {
				err = l.Close()
			}
		} else {
			var pc net.PacketConn
			if pc, err = net.ListenPacket("udp", b.addr); err == nil {
				err = pc.Close()
			}
		}
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("bind %s %s (%s): address in use (is another meshnode running? choose another %s)", b.setting, b.addr, b.network, b.flag)
			}
			return fmt.Errorf("bind %s %s (%s): %w", b.setting, b.addr, b.network, errors.Unwrap(err))
		}
	}
	return nil
}

// joinWait bounds how long a daemon with seeds waits to join before it
// tells systemd it is ready anyway (running alone; /readyz stays 503 until
// it joins): a node whose seeds are all down must still start.
const joinWait = 20 * time.Second

// runDaemon runs a node until ctx ends, then shuts down gracefully. hup
// delivers SIGHUP; reload re-reads the configuration.
func runDaemon(ctx context.Context, cfg Config, logw io.Writer, hup <-chan os.Signal, reload func() (Config, error)) error {
	logger, level := newLogger(cfg, logw)
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
		return startError(cfg, "bind admin_addr "+cfg.AdminAddr, err)
	}
	if err := checkBinds(cfg); err != nil {
		_ = l.Close()
		return err
	}
	// Streams the node forgets (idle past their retention) lose the
	// inboxes' records of them too.
	forget := inbox.NewForgetter(store, logger)
	nc.Outbox.OnForget = forget.Add
	defer forget.Close() // after the node's close (deferred later), before the inbox's
	// Every ask and handler run of the node is timed for /metrics.
	calls := metrics.NewCalls()
	calls.Install(&nc)
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

	col := metrics.New(metrics.ForNode(n), metrics.WithCalls(calls))
	boxes := &daemonInbox{Store: store, n: n, log: logger}
	for _, name := range append(store.Inboxes(), cfg.Inboxes...) {
		if _, err := boxes.Declare(name); err != nil {
			_ = l.Close()
			return fmt.Errorf("declare inbox %q: %w", name, err)
		}
	}
	if _, err := n.Spawn(keyringActor, keyringHandler(n)); err != nil {
		_ = l.Close()
		return fmt.Errorf("spawn %s: %w", keyringActor, err)
	}
	if err := n.Start(ctx); err != nil {
		_ = l.Close()
		return startError(cfg, "start node", err)
	}
	joined := func() bool { return len(cfg.Join) == 0 || aliveMembers(n) > 1 }
	acfg := admin.DefaultConfig()
	acfg.Addr, acfg.Token, acfg.Backend, acfg.Inbox, acfg.Logger = cfg.AdminAddr, cfg.AdminToken, admin.NodeBackend{Node: n}, boxes, logger
	acfg.Metrics, acfg.Pprof = col, cfg.Pprof
	acert, atls, err := adminTLS(cfg)
	if err != nil {
		_ = l.Close()
		return err
	}
	acfg.TLS = atls
	if nc.GossipKey != nil {
		acfg.Keyring = keyringFanOut(n)
	}
	acfg.Ready = func() error { return ready(joined, cfg.Join, n.Outbox().Err, store.Err) }
	acfg.Live = func() error { return storeFailure(n.Outbox().Err, store.Err) }
	srv, err := admin.New(acfg)
	if err != nil {
		_ = l.Close()
		return fmt.Errorf("%w: %w", errBadConfig, err)
	}
	srv.Serve(l)
	defer func() { _ = srv.Close() }()
	logger.Info("meshnode running", "name", cfg.Name, "cluster", cfg.Cluster, "gossip", n.GossipAddr(),
		"quic", n.QUICAddr(), "admin", l.Addr().String(), "admin_https", atls != nil, "inboxes", store.Inboxes(), "version", version.Get().Version)

	notifyReady(ctx, logger, joined)
	d := &daemonState{cfg: cfg, log: logger, level: level, srv: srv, node: n, adminCert: acert}
	for {
		select {
		case <-ctx.Done():
			logger.Info("shutting down: leaving the cluster and flushing")
			if err := sdNotify("STOPPING=1"); err != nil {
				logger.Warn("systemd notification failed", "err", err)
			}
			// Order: stop taking API requests, then leave and close the node
			// (its actors append to the inbox), then the inbox (deferred).
			_ = srv.Close()
			return nil
		case <-hup:
			d.reload(reload)
		}
	}
}

func aliveMembers(n *node.Node) int {
	alive := 0
	for _, m := range n.Members() {
		if m.State == mesh.StateAlive {
			alive++
		}
	}
	return alive
}

// ready is /readyz's answer: nil once the node joined its cluster, while
// its stores (the outbox, the inboxes) take writes: after a failed sync
// the daemon must be restarted.
func ready(joined func() bool, seeds []string, stores ...func() error) error {
	if !joined() {
		return fmt.Errorf("not joined: no seed of %v answered yet", seeds)
	}
	return storeFailure(stores...)
}

// storeFailure is why the daemon must be restarted (/healthz fails with
// it): the failure of the first of its stores that stopped, or nil.
func storeFailure(stores ...func() error) error {
	for _, failed := range stores {
		if err := failed(); err != nil {
			return err
		}
	}
	return nil
}

// notifyReady tells systemd READY=1 once the node has joined, or after
// joinWait without a seed (then STATUS says so).
func notifyReady(ctx context.Context, logger *slog.Logger, joined func() bool) {
	deadline := time.Now().Add(joinWait)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	status := "STATUS=joined the cluster"
	for !joined() {
		if time.Now().After(deadline) {
			status = "STATUS=running alone: no seed answered yet, still trying"
			logger.Warn("no seed answered within " + joinWait.String() + ": running alone, the reconnect loop keeps trying")
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	if err := sdNotify("READY=1", status); err != nil {
		logger.Warn("systemd notification failed", "err", err)
	}
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
	if _, err := d.n.Spawn(name, inbox.Handler(d.Store, name), inbox.SpawnOptions(d.Store, name)...); err != nil && !errors.Is(err, node.ErrActorExists) {
		return created, fmt.Errorf("spawn inbox actor %q: %w", name, err)
	}
	if created {
		d.log.Info("inbox declared", "inbox", name)
	}
	return created, nil
}

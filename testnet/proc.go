package testnet

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/transport"
)

// ProcOption configures a ProcCluster.
type ProcOption func(*procOptions)

type procOptions struct {
	netns        bool          // each daemon in its own network namespace
	inboxes      []string      // inboxes declared by every daemon at start
	converge     time.Duration // bound of the convergence wait at start
	stopTimeout  time.Duration // bound of Stop's wait after SIGTERM
	adminTimeout time.Duration // bound of one admin API request
	logLevel     string        // daemon log level
	cluster      string        // cluster name written to every config
}

func defaultProcOptions() procOptions {
	return procOptions{
		netns:        false,
		inboxes:      nil,
		converge:     30 * time.Second,
		stopTimeout:  20 * time.Second,
		adminTimeout: 15 * time.Second,
		logLevel:     "info",
		cluster:      "testnet-proc",
	}
}

func (o procOptions) validate() error {
	switch {
	case o.converge <= 0:
		return fmt.Errorf("testnet: proc options: converge timeout %v must be positive", o.converge)
	case o.stopTimeout <= 0:
		return fmt.Errorf("testnet: proc options: stop timeout %v must be positive", o.stopTimeout)
	case o.adminTimeout <= 0:
		return fmt.Errorf("testnet: proc options: admin timeout %v must be positive", o.adminTimeout)
	}
	switch o.logLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("testnet: proc options: log level %q: want debug, info, warn or error", o.logLevel)
	}
	return nil
}

// WithNetns runs each daemon in its own network namespace, joined to the
// others by a veth pair to a bridge in a hub namespace; Isolate and Heal
// take links down and up. StartProcs fails with ErrNoNetns where that is
// impossible (see NetnsAvailable).
func WithNetns() ProcOption { return func(o *procOptions) { o.netns = true } }

// WithInboxes makes every daemon declare these inboxes at start.
func WithInboxes(names ...string) ProcOption {
	return func(o *procOptions) { o.inboxes = append(o.inboxes, names...) }
}

// WithProcConvergeTimeout bounds the wait for n alive members at start
// (default 30 s).
func WithProcConvergeTimeout(d time.Duration) ProcOption {
	return func(o *procOptions) { o.converge = d }
}

// WithProcLogLevel sets the daemons' log level (default "info").
func WithProcLogLevel(level string) ProcOption { return func(o *procOptions) { o.logLevel = level } }

// ProcCluster is n real `meshnode run` processes sharing one generated CA
// and gossip key, named "n0".."n<n-1>", each with its own config, data
// directory and log file under one temporary directory. Kill is SIGKILL,
// so what survives a Kill is what the daemon had on disk. Methods are safe
// for concurrent use; indexes are 0..n-1.
type ProcCluster struct {
	bin  string
	dir  string // removed by Close
	opts procOptions
	ns   *nsNet // nil unless WithNetns
	wg   sync.WaitGroup

	// mu guards the fields below.
	mu     sync.Mutex
	procs  []*proc
	closed bool
}

// proc is one daemon. Its fields other than cmd/done/starts are fixed at
// StartProcs; the mutable ones are guarded by ProcCluster.mu.
type proc struct {
	name, config, dataDir, logPath string
	admin                          string // host:port of the admin API (inside ns when ns != "")
	gossip                         string // host:port of memberlist
	ns                             string // network namespace; "" on loopback
	client                         *http.Client

	cmd    *exec.Cmd     // nil when not running
	done   chan struct{} // closed when cmd has been waited for
	starts int           // incarnations started so far
}

// NewProcs starts a ProcCluster for a test and closes it in tb.Cleanup;
// when tb failed, the daemons' logs are printed first. It fails tb when
// the cluster cannot start.
func NewProcs(tb testing.TB, bin string, n int, opts ...ProcOption) *ProcCluster {
	tb.Helper()
	c, err := StartProcs(context.Background(), bin, n, opts...)
	if err != nil {
		tb.Fatalf("testnet: start %d daemons: %v", n, err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Log(c.AllLogs())
		}
		if err := c.Close(); err != nil {
			tb.Errorf("testnet: close daemons: %v", err)
		}
	})
	return c
}

// StartProcs generates a CA, node certificates and a gossip key in a new
// temporary directory, writes one TOML config per node (free loopback
// ports, or namespace addresses with WithNetns), starts `bin run --config`
// for each and waits until every admin API reports n alive members. On
// failure everything it made is removed and the error says which daemon
// failed; its log is part of the error.
func StartProcs(ctx context.Context, bin string, n int, opts ...ProcOption) (*ProcCluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("testnet: start procs: %w: %d nodes", ErrBadIndex, n)
	}
	o := defaultProcOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("testnet: start procs: %w: %q (build it with `go build -o BIN ./cmd/meshnode`)", ErrBadBinary, bin)
	}
	// A port probed free can be taken by another process before the
	// daemon binds it; the start is then tried again on other ports.
	for attempt := 1; ; attempt++ {
		c, err := startProcs(ctx, bin, n, o)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == portAttempts {
			return c, err
		}
	}
}

// portAttempts bounds StartProcs' tries when a daemon finds its port taken.
const portAttempts = 3

// errPortTaken: a daemon exited at start because its address was in use.
var errPortTaken = errors.New("a daemon's port was taken before it could bind it")

// startProcs is one try of StartProcs with validated options.
func startProcs(ctx context.Context, bin string, n int, o procOptions) (*ProcCluster, error) {
	dir, err := os.MkdirTemp("", "meshnode-procs-")
	if err != nil {
		return nil, fmt.Errorf("testnet: start procs: temp dir: %w", err)
	}
	c := &ProcCluster{bin: bin, dir: dir, opts: o}
	fail := func(err error) (*ProcCluster, error) {
		logs := c.AllLogs()
		_ = c.Close()
		if !o.netns && strings.Contains(logs, "address in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, fmt.Errorf("testnet: start procs: %w\n%s", err, logs)
	}
	if o.netns {
		if c.ns, err = newNsNet(); err != nil {
			return fail(err)
		}
	}
	if err := c.writeConfigs(n); err != nil {
		return fail(err)
	}
	for i := range n {
		if err := c.start(i); err != nil {
			return fail(err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, o.converge)
	defer cancel()
	if err := c.WaitConverged(cctx); err != nil {
		return fail(err)
	}
	return c, nil
}

// writeConfigs creates the CA, certificates, gossip key, namespaces (with
// WithNetns) and one config file per node.
func (c *ProcCluster) writeConfigs(n int) error {
	certs := filepath.Join(c.dir, "certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return fmt.Errorf("certs dir: %w", err)
	}
	ca, err := transport.NewCA("testnet proc CA", 24*time.Hour)
	if err != nil {
		return fmt.Errorf("CA: %w", err)
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return fmt.Errorf("CA key: %w", err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	files := map[string][]byte{
		"ca.crt":     ca.CertPEM(),
		"ca.key":     caKey,
		"gossip.key": []byte(base64.StdEncoding.EncodeToString(key) + "\n"),
	}
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("n%d", i)
		crt, k, err := ca.Issue(names[i], 24*time.Hour)
		if err != nil {
			return fmt.Errorf("certificate of %s: %w", names[i], err)
		}
		files[names[i]+".crt"], files[names[i]+".key"] = crt, k
	}
	for f, data := range files {
		if err := os.WriteFile(filepath.Join(certs, f), data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", f, err)
		}
	}

	procs := make([]*proc, n)
	for i, name := range names {
		p := &proc{name: name, config: filepath.Join(c.dir, name+".toml"), dataDir: filepath.Join(c.dir, name),
			logPath: filepath.Join(c.dir, name+".log")}
		quic := ""
		if c.ns != nil {
			// Each namespace has its own port space: fixed ports are free.
			ip, ns, err := c.ns.addNode(i)
			if err != nil {
				return err
			}
			p.ns = ns
			p.gossip, quic, p.admin = net.JoinHostPort(ip, "7946"), net.JoinHostPort(ip, "7947"), "127.0.0.1:7948"
			p.client = &http.Client{Timeout: c.opts.adminTimeout, Transport: &http.Transport{
				DialContext: c.ns.dialer(i), DisableKeepAlives: true}}
		} else {
			ports, err := pickPorts(3)
			if err != nil {
				return err
			}
			p.gossip = fmt.Sprintf("127.0.0.1:%d", ports[0])
			quic = fmt.Sprintf("127.0.0.1:%d", ports[1])
			p.admin = fmt.Sprintf("127.0.0.1:%d", ports[2])
			// No keep-alive: a SIGKILLed daemon must not leave idle
			// connections (and their goroutines) behind in the client.
			p.client = &http.Client{Timeout: c.opts.adminTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
		}
		procs[i] = p
		if err := writeProcConfig(p, quic, certs, c.opts); err != nil {
			return err
		}
	}
	// Every node joins every other: a restarted node (the first one
	// included) finds the cluster from its config alone. Unreachable seeds
	// are retried by the daemon's reconnect loop.
	for i, p := range procs {
		var join []string
		for j, q := range procs {
			if j != i {
				join = append(join, q.gossip)
			}
		}
		f, err := os.OpenFile(p.config, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("config of %s: %w", p.name, err)
		}
		_, err = fmt.Fprintf(f, "join = %s\n", tomlList(join))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("config of %s: %w", p.name, err)
		}
	}
	c.mu.Lock()
	c.procs = procs
	c.mu.Unlock()
	return nil
}

func writeProcConfig(p *proc, quic, certs string, o procOptions) error {
	text := fmt.Sprintf(`name = %q
cluster = %q
data_dir = %q
gossip_addr = %q
quic_addr = %q
ca_file = %q
gossip_key_file = %q
admin_addr = %q
log_level = %q
inboxes = %s
`, p.name, o.cluster, p.dataDir, p.gossip, quic, filepath.Join(certs, "ca.crt"), filepath.Join(certs, "gossip.key"),
		p.admin, o.logLevel, tomlList(o.inboxes))
	if err := os.WriteFile(p.config, []byte(text), 0o600); err != nil {
		return fmt.Errorf("config of %s: %w", p.name, err)
	}
	return nil
}

func tomlList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = fmt.Sprintf("%q", x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// pickPorts is freePorts; a test replaces it to hand out a taken port.
var pickPorts = freePorts

// freePorts returns k distinct ports free for both TCP and UDP on
// 127.0.0.1 (memberlist uses both on its port; QUIC uses UDP). A port can
// still be taken between this check and the daemon's bind; the daemon then
// exits with "address in use", and StartProcs tries again on other ports
// (a Restart reports it).
func freePorts(k int) ([]int, error) {
	var out []int
	seen := make(map[int]bool)
	for range 100 * k {
		if len(out) == k {
			return out, nil
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		_ = l.Close()
		if err != nil {
			continue
		}
		_ = u.Close()
		if !seen[port] {
			seen[port] = true
			out = append(out, port)
		}
	}
	if len(out) == k {
		return out, nil
	}
	return nil, errors.New("free port: none found on 127.0.0.1")
}

// get returns proc i.
func (c *ProcCluster) get(i int) (*proc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.procs) {
		return nil, fmt.Errorf("testnet: %w: %d of %d", ErrBadIndex, i, len(c.procs))
	}
	return c.procs[i], nil
}

// start launches daemon i, which must not be running. Its output is
// appended to its log file after a marker line naming the incarnation.
func (c *ProcCluster) start(i int) error {
	p, err := c.get(i)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if p.cmd != nil {
		return fmt.Errorf("testnet: start %s: %w", p.name, ErrRunning)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("testnet: start %s: log file: %w", p.name, err)
	}
	p.starts++
	fmt.Fprintf(logf, "=== testnet: start #%d of %s at %s ===\n", p.starts, p.name, time.Now().Format(time.RFC3339Nano))
	args := []string{c.bin, "run", "--config", p.config}
	if p.ns != "" {
		// ip execs the binary in place: the pid is the daemon's, so
		// SIGKILL and SIGTERM reach it directly.
		args = append([]string{"ip", "netns", "exec", p.ns}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf // *os.File: no copying goroutines
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("testnet: start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		_ = cmd.Wait() // a killed daemon's exit status is expected; its log tells the rest
		_ = logf.Close()
		close(done)
	}()
	return nil
}

// signal sends sig to daemon i and waits up to timeout for it to exit.
func (c *ProcCluster) signal(i int, sig syscall.Signal, timeout time.Duration) error {
	p, err := c.get(i)
	if err != nil {
		return err
	}
	c.mu.Lock()
	cmd, done := p.cmd, p.done
	c.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("testnet: signal %s: %w", p.name, ErrNotRunning)
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("testnet: signal %s: %w", p.name, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		_ = cmd.Process.Kill()
		<-done
		c.clear(p, cmd)
		return fmt.Errorf("testnet: %s did not exit within %v of %v; killed", p.name, timeout, sig)
	}
	c.clear(p, cmd)
	if sig == syscall.SIGTERM && cmd.ProcessState != nil && !cmd.ProcessState.Success() {
		return fmt.Errorf("testnet: %s: %w after SIGTERM: %s", p.name, ErrProcExited, cmd.ProcessState)
	}
	return nil
}

// clear marks p as not running if cmd is still its current process.
func (c *ProcCluster) clear(p *proc, cmd *exec.Cmd) {
	c.mu.Lock()
	if p.cmd == cmd {
		p.cmd, p.done = nil, nil
	}
	c.mu.Unlock()
}

// Kill sends SIGKILL to daemon i and waits until it is gone: a crash, with
// no leave, flush or graceful close.
func (c *ProcCluster) Kill(i int) error { return c.signal(i, syscall.SIGKILL, c.opts.stopTimeout) }

// Stop sends SIGTERM to daemon i and waits for it to exit; an exit status
// other than 0 is an error (the daemon promises a clean exit on SIGTERM).
func (c *ProcCluster) Stop(i int) error { return c.signal(i, syscall.SIGTERM, c.opts.stopTimeout) }

// Restart starts daemon i again with the same config, ports and data
// directory, and waits until its admin API answers (not for convergence:
// call WaitConverged).
func (c *ProcCluster) Restart(i int) error {
	if err := c.start(i); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.converge)
	defer cancel()
	return c.waitAdmin(ctx, i)
}

// Running reports whether daemon i is running (started and not exited).
func (c *ProcCluster) Running(i int) bool {
	p, err := c.get(i)
	if err != nil {
		return false
	}
	c.mu.Lock()
	done := p.done
	c.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Len returns the number of daemons, running or not.
func (c *ProcCluster) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.procs)
}

// Name returns the node name of daemon i ("" for a bad index).
func (c *ProcCluster) Name(i int) string {
	p, err := c.get(i)
	if err != nil {
		return ""
	}
	return p.name
}

// Admin returns the base URL of daemon i's admin API ("" for a bad
// index). With WithNetns it is an address inside the daemon's namespace:
// use the cluster's helpers, which dial from inside it.
func (c *ProcCluster) Admin(i int) string {
	p, err := c.get(i)
	if err != nil {
		return ""
	}
	return "http://" + p.admin
}

// DataDir returns daemon i's data directory ("" for a bad index).
func (c *ProcCluster) DataDir(i int) string {
	p, err := c.get(i)
	if err != nil {
		return ""
	}
	return p.dataDir
}

// Dir returns the cluster's temporary directory (certs, configs, logs).
func (c *ProcCluster) Dir() string { return c.dir }

// Logs returns everything daemon i wrote, across its incarnations.
func (c *ProcCluster) Logs(i int) string {
	p, err := c.get(i)
	if err != nil {
		return ""
	}
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log for %s: %v)", p.name, err)
	}
	return string(data)
}

// AllLogs returns every daemon's log, each under a header.
func (c *ProcCluster) AllLogs() string {
	var b strings.Builder
	for i := range c.Len() {
		fmt.Fprintf(&b, "----- log of %s -----\n%s", c.Name(i), c.Logs(i))
	}
	return b.String()
}

// Close kills every daemon, waits for them, deletes the namespaces and
// links (WithNetns) and removes the temporary directory. It is idempotent.
func (c *ProcCluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var cmds []*exec.Cmd
	for _, p := range c.procs {
		if p.cmd != nil {
			cmds = append(cmds, p.cmd)
		}
	}
	c.mu.Unlock()
	for _, cmd := range cmds {
		_ = cmd.Process.Kill()
	}
	c.wg.Wait()
	var errs []error
	if c.ns != nil {
		if err := c.ns.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("testnet: close: remove %s: %w", c.dir, err))
	}
	return errors.Join(errs...)
}

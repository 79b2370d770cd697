package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
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

	"github.com/meshnode/meshnode/internal/testutil"
	bolt "go.etcd.io/bbolt"
)

// freePort returns a port free for both TCP and UDP on 127.0.0.1 (memberlist
// uses both on the gossip port; QUIC uses UDP). The daemon binds it later,
// so it is drawn below Linux's ephemeral range (32768 and up by default):
// a port the kernel handed out for ":0" could be given to another test's
// socket in between, one below the range only to an explicit bind.
func freePort(tb testing.TB) int {
	tb.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 200 {
		port := 20000 + rand.IntN(12000)
		if handedOut.ports[port] {
			continue // free now, but another daemon of this run may bind it yet
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		_ = l.Close()
		if err == nil {
			_ = u.Close()
			handedOut.ports[port] = true
			return port
		}
	}
	tb.Fatal("no free port")
	return 0
}

// handedOut is every port freePort returned in this run.
var handedOut = struct {
	sync.Mutex // guards ports
	ports      map[int]bool
}{ports: map[int]bool{}}

// cli runs the binary and returns its stdout, stderr and error.
func cli(tb testing.TB, stdin string, args ...string) (string, string, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, meshnodeBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errb, strings.NewReader(stdin)
	err := cmd.Run()
	return out.String(), errb.String(), err
}

func mustCLI(tb testing.TB, args ...string) string {
	tb.Helper()
	out, errOut, err := cli(tb, "", args...)
	if err != nil {
		tb.Fatalf("meshnode %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// daemon is one `meshnode run` process.
type daemon struct {
	name, config, admin, dataDir string
	env                          []string   // added to the process's environment
	owner                        testing.TB // the test whose cleanup kills the process: daemons outlive subtests

	mu   sync.Mutex
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan error
}

type cluster struct {
	dir, certs string
	nodes      []*daemon
}

func writeConfig(tb testing.TB, path, text string) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		tb.Fatal(err)
	}
}

func newCluster(tb testing.TB, names ...string) *cluster {
	tb.Helper()
	c := &cluster{dir: tb.TempDir()}
	c.certs = filepath.Join(c.dir, "certs")
	mustCLI(tb, "ca", "init", "--dir", c.certs)
	for _, n := range names {
		mustCLI(tb, "cert", "issue", "--name", n, "--ca-dir", c.certs)
	}
	mustCLI(tb, "keygen", "--out", filepath.Join(c.certs, "gossip.key"))
	var seed string
	for i, n := range names {
		d := &daemon{owner: tb, name: n, config: filepath.Join(c.dir, n+".toml"), dataDir: filepath.Join(c.dir, n),
			admin: fmt.Sprintf("127.0.0.1:%d", freePort(tb))}
		gossip := fmt.Sprintf("127.0.0.1:%d", freePort(tb))
		join := ""
		if i == 0 {
			seed = gossip
		} else {
			join = fmt.Sprintf("join = [%q]\n", seed)
		}
		writeConfig(tb, d.config, fmt.Sprintf(`name = %q
cluster = "e2e"
data_dir = %q
gossip_addr = %q
quic_addr = "127.0.0.1:%d"
%sca_file = %q
gossip_key_file = %q
admin_addr = %q
log_level = "debug"
inboxes = ["box"]
`, n, d.dataDir, gossip, freePort(tb), join, filepath.Join(c.certs, "ca.crt"), filepath.Join(c.certs, "gossip.key"), d.admin))
		c.nodes = append(c.nodes, d)
	}
	return c
}

// start runs the daemon and waits until its admin API answers.
func (d *daemon) start(tb testing.TB) {
	tb.Helper()
	d.mu.Lock()
	d.logs = &syncBuffer{}
	d.cmd = exec.Command(meshnodeBin, "run", "--config", d.config)
	d.cmd.Env = append(os.Environ(), d.env...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := d.cmd.Start(); err != nil {
		d.mu.Unlock()
		tb.Fatal(err)
	}
	d.done = make(chan error, 1)
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	go func() { done <- cmd.Wait() }()
	d.owner.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done // ends the Wait goroutine; an already stopped process just returns
		done <- nil
	})
	testutil.WaitFor(tb, 20*time.Second, d.name+" admin API up", func() bool {
		select {
		case err := <-done:
			done <- err
			tb.Fatalf("%s exited during start: %v\n%s", d.name, err, d.output())
		default:
		}
		resp, err := http.Get("http://" + d.admin + "/v1/members")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

func (d *daemon) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

// syncBuffer is a bytes.Buffer the process's output copier writes while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// stop sends SIGTERM and expects a clean exit 0.
func (d *daemon) stop(tb testing.TB) {
	tb.Helper()
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		tb.Fatalf("%s: %v\n%s", d.name, err, d.output())
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			tb.Fatalf("%s: exit after SIGTERM: %v\n%s", d.name, err, d.output())
		}
	case <-time.After(20 * time.Second):
		tb.Fatalf("%s did not exit within 20s of SIGTERM\n%s", d.name, d.output())
	}
}

func (d *daemon) cli(tb testing.TB, args ...string) string {
	tb.Helper()
	return mustCLI(tb, append(args, "--admin", d.admin)...)
}

type pulled struct {
	Cursor uint64          `json:"cursor"`
	MsgID  string          `json:"msg_id"`
	Body   json.RawMessage `json:"body"`
}

func (d *daemon) pull(tb testing.TB, after uint64) []pulled {
	tb.Helper()
	out := d.cli(tb, "inbox", "pull", "box", "--after", fmt.Sprint(after), "--max", "1000")
	var msgs []pulled
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var m pulled
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			tb.Fatalf("pull line %q: %v", line, err)
		}
		msgs = append(msgs, m)
	}
	return msgs
}

func bodies(msgs []pulled) string {
	var parts []string
	for _, m := range msgs {
		var v map[string]any
		_ = json.Unmarshal(m.Body, &v)
		parts = append(parts, fmt.Sprint(v["n"]))
	}
	return strings.Join(parts, ",")
}

func aliveCount(tb testing.TB, d *daemon) int {
	tb.Helper()
	out, _, err := cli(tb, "", "members", "--admin", d.admin)
	if err != nil {
		return -1
	}
	return strings.Count(out, " alive ")
}

func TestEndToEnd(t *testing.T) {
	c := newCluster(t, "n1", "n2", "n3")
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	notify := listenNotify(t)
	n2.env = []string{"NOTIFY_SOCKET=" + notify.LocalAddr().String()}
	for _, d := range c.nodes {
		d.start(t)
	}
	// n2 joins through n1: systemd hears READY=1 once it has joined.
	if got := readNotify(t, notify); got != "READY=1\nSTATUS=joined the cluster" {
		t.Fatalf("n2 notified %q", got)
	}
	for _, d := range c.nodes {
		testutil.WaitFor(t, 15*time.Second, d.name+" sees 3 alive members", func() bool { return aliveCount(t, d) == 3 })
	}
	if out := n1.cli(t, "members"); !strings.Contains(out, "NAME") || !strings.Contains(out, "n3") {
		t.Fatalf("members table:\n%s", out)
	}

	t.Run("tell ask send from the CLI", func(t *testing.T) {
		if out := n1.cli(t, "tell", "box@n2", `{"n": 1}`); strings.TrimSpace(out) != "sent" {
			t.Fatalf("tell: %q", out)
		}
		testutil.WaitFor(t, 10*time.Second, "tell arrives in n2's inbox", func() bool { return bodies(n2.pull(t, 0)) == "1" })
		out := n1.cli(t, "ask", "box@n3", `{"n": 2}`)
		var reply map[string]any
		if err := json.Unmarshal([]byte(out), &reply); err != nil || reply["inbox"] != "box" || reply["cursor"] != float64(1) {
			t.Fatalf("ask reply %q: %v", out, err)
		}
		if out := n1.cli(t, "send", "box@n2", `{"n": 3}`, "--key", "k3"); strings.TrimSpace(out) != "Delivered" {
			t.Fatalf("send: %q", out)
		}
		// Delivered means it is on disk in n2's inbox already: no waiting.
		if got := bodies(n2.pull(t, 0)); got != "1,3" {
			t.Fatalf("n2 inbox after Delivered = %s, want 1,3", got)
		}
		// Body from stdin.
		if out, errOut, err := cli(t, `{"n": 4}`, "tell", "box@n1", "-", "--admin", n1.admin); err != nil || strings.TrimSpace(out) != "sent" {
			t.Fatalf("tell from stdin: %v %s %s", err, out, errOut)
		}
		// Errors are one clear line.
		_, errOut, err := cli(t, "", "tell", "nobody@n9", `{}`, "--admin", n1.admin)
		if err == nil || !strings.Contains(errOut, "unreachable") {
			t.Fatalf("tell to unknown node: err %v, stderr %q", err, errOut)
		}
	})

	t.Run("operator commands", func(t *testing.T) { testOperatorCommands(t, n1) })

	t.Run("SIGHUP reloads", func(t *testing.T) { testReload(t, n1) })

	t.Run("gossip key rotation on the running cluster", func(t *testing.T) { testKeyRotation(t, c, n1) })

	t.Run("send to a stopped node is queued and arrives after restart", func(t *testing.T) {
		n3.stop(t)
		testutil.WaitFor(t, 10*time.Second, "n1 sees n3 gone", func() bool { return aliveCount(t, n1) == 2 })
		if out := n1.cli(t, "send", "box@n3", `{"n": 5}`, "--key", "offline-5"); strings.TrimSpace(out) != "Queued" {
			t.Fatalf("send to stopped node: %q", out)
		}
		var st struct{ Depth int }
		_ = json.Unmarshal([]byte(n1.cli(t, "outbox", "stats", "--json")), &st)
		if st.Depth != 1 {
			t.Fatalf("outbox depth %d, want 1", st.Depth)
		}
		n3.start(t)
		testutil.WaitFor(t, 20*time.Second, "queued message reaches n3 after restart", func() bool {
			return strings.Contains(bodies(n3.pull(t, 0)), "5")
		})
		if got := bodies(n3.pull(t, 0)); got != "2,5" {
			t.Fatalf("n3 inbox = %s, want 2,5 (no loss, no duplicate)", got)
		}
	})

	t.Run("inbox survives a daemon restart", func(t *testing.T) {
		msgs := n2.pull(t, 0)
		if len(msgs) != 2 {
			t.Fatalf("n2 inbox has %d messages", len(msgs))
		}
		n2.cli(t, "inbox", "ack", "box", fmt.Sprint(msgs[0].Cursor))
		_, errOut, err := cli(t, "", "inbox", "ack", "box", "999", "--admin", n2.admin)
		if err == nil || !strings.Contains(errOut, "beyond") {
			t.Fatalf("ack past the stored messages: err %v, stderr %q", err, errOut)
		}
		n2.stop(t)
		n2.start(t)
		if got := bodies(n2.pull(t, 0)); got != "3" {
			t.Fatalf("after restart n2 inbox = %s, want 3 (acked 1 gone, unacked 3 kept once)", got)
		}
		if got := n2.pull(t, 0); got[0].Cursor != msgs[1].Cursor {
			t.Fatalf("cursor changed across restart: %d, want %d", got[0].Cursor, msgs[1].Cursor)
		}
		// Inboxes declared at runtime are re-spawned after a restart.
		n2.cli(t, "inbox", "declare", "late")
		n2.stop(t)
		n2.start(t)
		testutil.WaitFor(t, 15*time.Second, "n1 sees n2 again", func() bool { return aliveCount(t, n1) == 3 })
		if out := n1.cli(t, "send", "late@n2", `{"n": 6}`); strings.TrimSpace(out) != "Delivered" {
			t.Fatalf("send to runtime-declared inbox after restart: %q", out)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		resp, err := http.Get("http://" + n1.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{`meshnode_members{state="alive"} 3`, "meshnode_tell_total", `meshnode_reliable_total{outcome="queued"} 2`, /* one to the stopped n3, one dead-lettered */
			"meshnode_ask_total", "meshnode_outbox_depth 0", "meshnode_outbox_aimd_limit", "meshnode_dedupe_hits_total",
			"meshnode_ask_duration_seconds_bucket", "meshnode_inbox_depth", "meshnode_peer_frames_total{direction=", `meshnode_handler_duration_seconds_count{actor="box",outcome="ok"}`,
			"meshnode_build_info{", "go_goroutines", "process_open_fds"} {
			if !strings.Contains(string(data), want) {
				t.Errorf("metrics lack %q", want)
			}
		}
		if t.Failed() {
			t.Log(string(data))
		}
	})

	t.Run("start-up failures are clear", func(t *testing.T) {
		bad := filepath.Join(c.dir, "bad.toml")
		tests := []struct {
			name, config string
			args         []string
			want         string
		}{
			{"unknown key", "name = \"n1\"\nadmn_addr = \"x\"\n", nil, `unknown key "admn_addr"`},
			{"missing certificate", fmt.Sprintf("name = \"n9\"\nca_file = %q\n", filepath.Join(c.certs, "ca.crt")), nil, "meshnode cert issue --name n9"},
			{"same data dir", "", []string{"--config", n1.config, "--admin-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
				"--gossip-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--quic-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t))},
				"is used by another meshnode (stop it or use --data-dir)"},
			{"admin port in use", "", []string{"--config", n1.config, "--data-dir", filepath.Join(c.dir, "other")}, "bind admin_addr " + n1.admin + ": address in use"},
			{"gossip port in use", "", []string{"--config", n1.config, "--data-dir", filepath.Join(c.dir, "other2"), "--admin-addr", fmt.Sprintf("127.0.0.1:%d", freePort(t))},
				"bind gossip_addr"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				args := append([]string{"run"}, tt.args...)
				if tt.config != "" {
					writeConfig(t, bad, tt.config)
					args = append(args, "--config", bad)
				}
				_, errOut, err := cli(t, "", args...)
				if err == nil {
					t.Fatal("started; want a failure")
				}
				last := strings.TrimSpace(errOut)
				if i := strings.LastIndex(last, "\n"); i >= 0 {
					last = last[i+1:]
				}
				if !strings.HasPrefix(last, "meshnode: ") || !strings.Contains(last, tt.want) {
					t.Fatalf("last stderr line %q lacks %q\n%s", last, tt.want, errOut)
				}
			})
		}
	})

	t.Run("graceful stop", func(t *testing.T) {
		for _, d := range []*daemon{n3, n2} {
			d.stop(t)
		}
		if !strings.Contains(n3.output(), "shutting down") {
			t.Fatalf("n3 logs lack the shutdown line:\n%s", n3.output())
		}
		n1.stop(t)
	})
}

func TestCertCommandsRefuseOverwrite(t *testing.T) {
	dir := t.TempDir()
	mustCLI(t, "ca", "init", "--dir", dir)
	if fi, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key mode: %v %v", fi.Mode(), err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"ca", "init", "--dir", dir}, "refusing to overwrite"},
		{[]string{"cert", "issue", "--ca-dir", dir}, "--name is required"},
		{[]string{"cert", "issue", "--name", "n1", "--ca-dir", filepath.Join(dir, "none")}, "meshnode ca init"},
		{[]string{"keygen"}, "--out is required"},
	}
	for _, tt := range tests {
		if _, errOut, err := cli(t, "", tt.args...); err == nil || !strings.Contains(errOut, tt.want) {
			t.Errorf("meshnode %v: err %v, stderr %q, want %q", tt.args, err, errOut, tt.want)
		}
	}
	mustCLI(t, "cert", "issue", "--name", "n1", "--ca-dir", dir)
	if _, errOut, err := cli(t, "", "cert", "issue", "--name", "n1", "--ca-dir", dir); err == nil || !strings.Contains(errOut, "refusing") {
		t.Errorf("second issue: %v %q", err, errOut)
	}
	key := filepath.Join(dir, "gossip.key")
	mustCLI(t, "keygen", "--out", key)
	if k, err := readGossipKey(key); err != nil || len(k) != 32 {
		t.Fatalf("gossip key: %v", err)
	}
	if _, errOut, err := cli(t, "", "keygen", "--out", key); err == nil || !strings.Contains(errOut, "refusing") {
		t.Errorf("second keygen: %v %q", err, errOut)
	}
}

func TestPurgeNeedsConfirmation(t *testing.T) {
	// No daemon: the refusal comes before any request.
	_, errOut, err := cli(t, "y\n", "dlq", "purge", "--all", "--admin", "127.0.0.1:1")
	if err == nil || !strings.Contains(errOut, "--yes") {
		t.Fatalf("purge without a terminal: err %v, stderr %q", err, errOut)
	}
	// With --yes it goes to the daemon (here: none), so the error names the daemon.
	_, errOut, err = cli(t, "", "dlq", "purge", "--all", "--yes", "--admin", "127.0.0.1:1")
	if err == nil || !strings.Contains(errOut, "cannot reach the daemon") {
		t.Fatalf("purge --yes without daemon: err %v, stderr %q", err, errOut)
	}
}

func TestHelpHasExamples(t *testing.T) {
	root := newRootCmd()
	for _, c := range root.Commands() {
		for _, sub := range append(c.Commands(), c) {
			if sub.Runnable() && !sub.HasSubCommands() && sub.Example == "" && sub.Name() != "help" && sub.Name() != "completion" {
				t.Errorf("%q has no Example", sub.CommandPath())
			}
		}
	}
}

// A stream idle for stream_retention is forgotten by its receiver, and the
// daemon's inbox drops its record of it too (the node's OnForget wired to
// the inbox). f1 sends one message to f2's inbox; f2 keeps sending to its
// own inbox, whose commits run the housekeeping, until it counts a stream
// forgotten; then f2's inbox file holds no stream of f1's.
func TestForgottenStreamLeavesTheInbox(t *testing.T) {
	c := newCluster(t, "f1", "f2")
	for _, d := range c.nodes {
		f, err := os.OpenFile(d.config, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteString("stream_retention = \"3s\"\nretention_margin = \"1s\"\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		d.start(t)
	}
	f1, f2 := c.nodes[0], c.nodes[1]
	for _, d := range c.nodes {
		testutil.WaitFor(t, 15*time.Second, d.name+" sees 2 alive members", func() bool { return aliveCount(t, d) == 2 })
	}
	if out := f1.cli(t, "send", "box@f2", `{"n": 1}`); strings.TrimSpace(out) != "Delivered" {
		t.Fatalf("send: %q", out)
	}
	streamsOf := func(node string) (n int) {
		db, err := bolt.Open(filepath.Join(f2.dataDir, "inbox.db"), 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		prefix := append([]byte{byte(len(node))}, node...) // how a stream key starts
		if err := db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("streams"))
			if b == nil {
				return errors.New("no streams bucket in inbox.db")
			}
			return b.ForEach(func(k, _ []byte) error {
				if bytes.HasPrefix(k, prefix) {
					n++
				}
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var st struct {
		StreamsForgotten uint64 `json:"streams_forgotten"`
	}
	testutil.WaitFor(t, 30*time.Second, "f2 forgets f1's stream", func() bool {
		f2.cli(t, "send", "box@f2", `{"n": 2}`)
		if err := json.Unmarshal([]byte(f2.cli(t, "outbox", "stats", "--json")), &st); err != nil {
			t.Fatal(err)
		}
		return st.StreamsForgotten > 0
	})
	f2.stop(t)
	if n := streamsOf("f1"); n != 0 {
		t.Fatalf("f2 forgot %d streams, yet its inbox still holds %d of f1's", st.StreamsForgotten, n)
	}
	if n := streamsOf("f2"); n != 1 {
		t.Fatalf("f2's inbox holds %d streams of its own, want 1 (it kept sending on it)", n)
	}
}

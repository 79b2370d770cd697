package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
)

func listenNotify(tb testing.TB) *net.UnixConn {
	tb.Helper()
	dir, err := os.MkdirTemp("", "sd") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	pc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "notify"), Net: "unixgram"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = pc.Close() })
	return pc
}

func readNotify(tb testing.TB, pc *net.UnixConn) string {
	tb.Helper()
	buf := make([]byte, 1024)
	_ = pc.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := pc.Read(buf)
	if err != nil {
		tb.Fatalf("no notification: %v", err)
	}
	return string(buf[:n])
}

func httpStatus(tb testing.TB, url string) int {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func testOperatorCommands(t *testing.T, n1 *daemon) {
	for _, p := range []string{"/healthz", "/readyz"} {
		if st := httpStatus(t, "http://"+n1.admin+p); st != 200 {
			t.Errorf("%s = %d", p, st)
		}
	}
	var members struct {
		Members []struct{ Name, State string } `json:"members"`
	}
	if err := json.Unmarshal([]byte(n1.cli(t, "members", "--json")), &members); err != nil || len(members.Members) != 3 {
		t.Fatalf("members --json: %v %+v", err, members)
	}
	if out := n1.cli(t, "inbox", "list"); !strings.Contains(out, "NAME") || !strings.Contains(out, "box") {
		t.Fatalf("inbox list:\n%s", out)
	}
	n1.cli(t, "tell", "box@n1", `{"n": 100}`)
	var pulled struct {
		Messages  []json.RawMessage `json:"messages"`
		NextAfter uint64            `json:"next_after"`
	}
	testutil.WaitFor(t, 10*time.Second, "the tell reaches n1's inbox", func() bool {
		pulled.Messages = nil
		return json.Unmarshal([]byte(n1.cli(t, "inbox", "pull", "box", "--json")), &pulled) == nil && len(pulled.Messages) > 0
	})
	if pulled.NextAfter == 0 {
		t.Fatalf("inbox pull --json has no next cursor: %+v", pulled)
	}
	var sent struct{ Outcome string }
	if err := json.Unmarshal([]byte(n1.cli(t, "send", "box@n1", `{"n": 101}`, "--json")), &sent); err != nil || sent.Outcome != "Delivered" {
		t.Fatalf("send --json: %v %+v", err, sent)
	}

	// Errors read once and exit with their kind.
	code, _, errOut := rc(t, nil, "ask", "nosuch@n2", `{}`, "--admin", n1.admin)
	if code != exitNotFound || !strings.Contains(errOut, `ask nosuch@n2: no actor "nosuch" runs on node "n2"`) || strings.Contains(errOut, "mailbox:") {
		t.Errorf("ask to a missing actor: exit %d, %q", code, errOut)
	}
	code, _, errOut = rc(t, nil, "tell", "box@n9", `{}`, "--admin", n1.admin)
	if code != exitUnreachable || !strings.Contains(errOut, `tell box@n9: node "n9" is unreachable`) || strings.Contains(errOut, "send to") {
		t.Errorf("tell to an unknown node: exit %d, %q", code, errOut)
	}
	code, _, errOut = rc(t, nil, "dlq", "replay", "--id", "nope", "--reason", "x", "--admin", n1.admin)
	if code != 0 || strings.Contains(errOut, "All") {
		t.Errorf("dlq replay of nothing: exit %d, %q", code, errOut)
	}

	// A dead letter, shown with its body: a message for a node nobody has
	// seen expires (its TTL runs out before it was ever sent).
	out, _, err := cli(t, "", "send", "box@n9", `{"poison": true}`, "--key", "p1", "--ttl", "1s", "--admin", n1.admin)
	t.Logf("send to a node that does not exist: %q %v", out, err)
	var dls struct {
		DeadLetters []struct {
			ID string `json:"id"`
		} `json:"dead_letters"`
	}
	testutil.WaitFor(t, 15*time.Second, "the expired message is dead-lettered", func() bool {
		return json.Unmarshal([]byte(n1.cli(t, "dlq", "list", "--recipient", "box@n9", "--json")), &dls) == nil && len(dls.DeadLetters) == 1
	})
	show := n1.cli(t, "dlq", "show", dls.DeadLetters[0].ID)
	for _, want := range []string{"box@n9", "p1", `"poison": true`, "expired"} {
		if !strings.Contains(show, want) {
			t.Errorf("dlq show lacks %q:\n%s", want, show)
		}
	}
	if code, _, errOut := rc(t, nil, "dlq", "show", "ffffffffffffffff", "--admin", n1.admin); code != exitNotFound {
		t.Errorf("dlq show of a missing id: exit %d %q", code, errOut)
	}
	n1.cli(t, "dlq", "purge", "--recipient", "box@n9", "--yes")
}

// testReload changes the admin token and the log level in n1's config file,
// sends SIGHUP, and checks both apply while the node keeps running; then
// puts the file back.
func testReload(t *testing.T, n1 *daemon) {
	orig, err := os.ReadFile(n1.config)
	if err != nil {
		t.Fatal(err)
	}
	hup := func() {
		t.Helper()
		n1.mu.Lock()
		cmd := n1.cmd
		n1.mu.Unlock()
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	changed := strings.Replace(string(orig), `log_level = "debug"`, `log_level = "info"`, 1) + "admin_token = \"s3cret\"\n"
	writeConfig(t, n1.config, changed)
	hup()
	testutil.WaitFor(t, 10*time.Second, "the new token is required", func() bool {
		code, _, _ := rc(t, nil, "members", "--admin", n1.admin)
		return code == exitRefused
	})
	if code, out, errOut := rc(t, nil, "members", "--admin", n1.admin, "--token", "s3cret"); code != 0 || !strings.Contains(out, "n3") {
		t.Fatalf("members with the reloaded token: exit %d %q %q", code, out, errOut)
	}
	testutil.WaitFor(t, 10*time.Second, "the reload is logged", func() bool { return strings.Contains(n1.output(), "reloaded") })
	// log_level info: the debug lines stop.
	mark := len(n1.output())
	n1.cli(t, "tell", "box@n1", `{"n": 102}`, "--token", "s3cret")
	// Only up to the next reload, which turns debug on again.
	if after := n1.output()[mark:]; strings.Contains(after, "level=DEBUG") {
		t.Errorf("debug lines logged at log_level info:\n%s", after)
	}
	writeConfig(t, n1.config, string(orig))
	hup()
	testutil.WaitFor(t, 10*time.Second, "the token is gone again", func() bool {
		code, _, _ := rc(t, nil, "members", "--admin", n1.admin)
		return code == 0
	})
	// A broken file is refused and the daemon keeps running.
	writeConfig(t, n1.config, string(orig)+"bogus_key = 1\n")
	hup()
	testutil.WaitFor(t, 10*time.Second, "the refusal is logged", func() bool { return strings.Contains(n1.output(), "reload refused") })
	writeConfig(t, n1.config, string(orig))
	if code, _, errOut := rc(t, nil, "members", "--admin", n1.admin); code != 0 {
		t.Fatalf("daemon after a refused reload: exit %d %q", code, errOut)
	}
}

// The daemon is not ready before it joined, nor once one of its stores
// stopped taking writes: an orchestrator then restarts it.
func TestReadyNeedsAJoinAndWorkingStores(t *testing.T) {
	seeds := []string{"10.0.0.1:7946"}
	working := func() error { return nil }
	failed := func() error {
		return fmt.Errorf("outbox: commit: %w: fdatasync: input/output error", node.ErrStoreFailed)
	}
	if err := ready(func() bool { return false }, seeds, working); err == nil || !strings.Contains(err.Error(), "not joined") {
		t.Errorf("before joining: %v, want not joined", err)
	}
	if err := ready(func() bool { return true }, seeds, working, failed); !errors.Is(err, node.ErrStoreFailed) {
		t.Errorf("with a failed store: %v, want its failure", err)
	}
	if err := ready(func() bool { return true }, seeds, working, working); err != nil {
		t.Errorf("joined, stores working: %v", err)
	}
}

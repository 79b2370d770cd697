package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// rc runs the binary and returns its exit code and stderr.
func rc(tb testing.TB, stdin io.Reader, args ...string) (int, string, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, meshnodeBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errb, stdin
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errb.String()
	}
	tb.Fatalf("meshnode %v: %v", args, err)
	return -1, "", ""
}

// silentAdmin accepts connections and never answers.
func silentAdmin(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	tb.Cleanup(func() {
		_ = l.Close()
		<-done
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

func TestExitCodes(t *testing.T) {
	hang := silentAdmin(t)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	tests := []struct {
		name  string
		stdin io.Reader
		args  []string
		code  int
		want  string
	}{
		{"unknown subcommand", nil, []string{"inbox", "lst"}, exitUsage, `unknown command "lst" for "meshnode inbox"`},
		{"unknown command", nil, []string{"membres"}, exitUsage, `unknown command "membres"`},
		{"unknown flag", nil, []string{"members", "--nope"}, exitUsage, "unknown flag: --nope"},
		{"too many arguments", nil, []string{"members", "x"}, exitUsage, "unknown command"},
		{"negative ttl", nil, []string{"send", "a@b", "{}", "--ttl", "-1s"}, exitUsage, "--ttl -1s is negative"},
		{"bad body", nil, []string{"tell", "a@b", "{"}, exitUsage, "not valid JSON"},
		{"purge without a terminal", devnull, []string{"dlq", "purge", "--all"}, exitUsage, "--yes"},
		{"purge without a filter", nil, []string{"dlq", "purge", "--yes"}, exitUsage, "--all"},
		{"daemon down", nil, []string{"members", "--admin", "127.0.0.1:1"}, exitUnreachable, "cannot reach the daemon at http://127.0.0.1:1: connection refused"},
		{"daemon hangs", nil, []string{"members", "--admin", hang, "--http-timeout", "500ms"}, exitUnreachable, "did not answer within 500ms"},
		{"bad config", nil, []string{"run", "--log-level", "loud"}, exitConfig, `log_level "loud"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			code, _, stderr := rc(t, tt.stdin, tt.args...)
			if code != tt.code || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, stderr, tt.code, tt.want)
			}
			if lines := strings.Count(strings.TrimSpace(stderr), "\n"); lines != 0 {
				t.Errorf("error is %d lines, want one:\n%s", lines+1, stderr)
			}
			if time.Since(start) > 20*time.Second {
				t.Errorf("took %v", time.Since(start))
			}
		})
	}
}

func TestConfirm(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		terminal bool
		code     int // 0: confirmed
	}{
		{"yes", "y\n", true, 0},
		{"YES without newline", "YES", true, 0},
		{"no", "n\n", true, exitFailure},
		{"empty line", "\n", true, exitFailure},
		{"end of input", "", true, exitUsage},
		{"not a terminal", "y\n", false, exitUsage},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := confirm(strings.NewReader(tt.in), tt.terminal, &out, "Purge? [y/N] ")
			if got := exitCode(err); got != tt.code {
				t.Fatalf("exit code %d (%v), want %d", got, err, tt.code)
			}
			if tt.terminal && !strings.Contains(out.String(), "Purge?") {
				t.Errorf("question not asked: %q", out.String())
			}
		})
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"version"}} {
		code, out, errOut := rc(t, nil, args...)
		if code != 0 || !regexp.MustCompile(`^meshnode \S+ \(rev \S+, go1\.\d+`).MatchString(out) {
			t.Errorf("meshnode %v: exit %d, out %q %q", args, code, out, errOut)
		}
	}
	code, out, _ := rc(t, nil, "version", "--json")
	var v struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Version == "" || !strings.HasPrefix(v.GoVersion, "go1.") {
		t.Errorf("version --json: exit %d, %q", code, out)
	}
}

// pflag shows a backticked word in a usage string as the flag's value
// placeholder ("--ca-file meshnode ca init"): no usage may have one.
func TestFlagUsagesHaveNoBackticks(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a backtick", c.CommandPath(), f.Name, f.Usage)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
}

// Every command that talks to the daemon or prints a result has --json.
func TestEveryCommandHasJSON(t *testing.T) {
	skip := map[string]bool{"run": true, "demo": true, "testnet": true, "help": true, "completion": true, "exit-codes": true}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if skip[c.Name()] {
			return
		}
		if c.Runnable() && !c.HasSubCommands() && c.Flags().Lookup("json") == nil {
			t.Errorf("%s has no --json", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	for _, c := range newRootCmd().Commands() {
		walk(c)
	}
}

// The README's exit-code table lists every code with its name.
func TestExitCodesDocumented(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range exitCodes {
		row := fmt.Sprintf("| %d | %s |", e.code, e.name)
		if !strings.Contains(string(readme), row) {
			t.Errorf("README.md lacks the row %q", row)
		}
	}
}

func TestLogLinesHaveUniqueKeys(t *testing.T) {
	var buf bytes.Buffer
	cfg := DefaultConfig()
	cfg.LogFormat = "json"
	logger, level := newLogger(cfg, &buf)
	l := logger.With("node", "edge1").With("component", "mesh").With("node", "edge1")
	l.Info("hello", "peer", "edge2", "node", "other", "peer", "again")
	l.Debug("hidden")
	level.Set(slog.LevelDebug)
	l.Debug("shown")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines (debug off, then on), got:\n%s", buf.String())
	}
	for _, line := range lines {
		for _, key := range []string{`"node":`, `"peer":`, `"component":`} {
			if n := strings.Count(line, key); n > 1 {
				t.Errorf("%s appears %d times in %s", key, n, line)
			}
		}
	}
	if !strings.Contains(lines[0], `"node":"edge1"`) || !strings.Contains(lines[0], `"peer":"edge2"`) {
		t.Errorf("the first value must win: %s", lines[0])
	}
}

func TestSDNotify(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify.sock")
	pc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	if err := sdNotify("READY=1", "STATUS=joined"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := pc.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1\nSTATUS=joined" {
		t.Fatalf("got %q, %v", buf[:n], err)
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if err := sdNotify("READY=1"); err != nil {
		t.Fatalf("without systemd: %v", err)
	}
}

func TestCertRenew(t *testing.T) {
	dir := t.TempDir()
	mustCLI(t, "ca", "init", "--dir", dir)
	mustCLI(t, "cert", "issue", "--name", "n1", "--ca-dir", dir, "--validity", "48h")
	crt := filepath.Join(dir, "n1.crt")
	before, err := certNotAfter(crt)
	if err != nil {
		t.Fatal(err)
	}
	if out := mustCLI(t, "cert", "renew", "--name", "n1", "--ca-dir", dir, "--within", "24h"); !strings.Contains(out, "not due") {
		t.Fatalf("renew of a certificate valid 48h with --within 24h: %q", out)
	}
	out := mustCLI(t, "cert", "renew", "--name", "n1", "--ca-dir", dir, "--within", "72h", "--json")
	var res struct {
		Renewed bool `json:"renewed"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || !res.Renewed {
		t.Fatalf("renew --json: %q %v", out, err)
	}
	after, err := certNotAfter(crt)
	if err != nil || !after.After(before.Add(300*24*time.Hour)) {
		t.Fatalf("renewed certificate valid until %v (was %v): %v", after, before, err)
	}
	// The new pair loads as an identity: certificate and key match.
	cfg := DefaultConfig()
	cfg.Name, cfg.CAFile = "n1", filepath.Join(dir, "ca.crt")
	if _, err := loadIdentity(cfg); err != nil {
		t.Fatalf("renewed files: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "n1.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("renewed key mode: %v %v", fi.Mode(), err)
	}
	if code, _, errOut := rc(t, nil, "cert", "renew", "--name", "n9", "--ca-dir", dir); code != exitFailure || !strings.Contains(errOut, "meshnode cert issue --name n9") {
		t.Fatalf("renew without a certificate: exit %d %q", code, errOut)
	}
}

// TestTestnetCPUProfile: --cpuprofile writes a gzipped pprof profile of the
// run, and a path it cannot create fails before anything runs.
func TestTestnetCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	code, _, stderr := rc(t, nil, "testnet", "run", "heartbeat-coalescing", "--size", "small", "--out", "", "--cpuprofile", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("profile of %d bytes is not gzipped pprof data", len(b))
	}
	code, _, stderr = rc(t, nil, "testnet", "run", "heartbeat-coalescing", "--size", "small", "--out", "", "--cpuprofile", filepath.Join(t.TempDir(), "missing", "cpu.pprof"))
	if code == 0 || !strings.Contains(stderr, "--cpuprofile") {
		t.Fatalf("unwritable profile path: exit %d, stderr %q", code, stderr)
	}
}

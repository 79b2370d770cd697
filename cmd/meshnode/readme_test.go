package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
)

// readmeSection returns the fenced blocks of README.md's single-host
// walk-through, in order, as (language, text) pairs.
func readmeSection(tb testing.TB) [][2]string {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		tb.Fatal(err)
	}
	text := string(data)
	i, j := strings.Index(text, "<!-- single-host: begin"), strings.Index(text, "<!-- single-host: end -->")
	if i < 0 || j < i {
		tb.Fatal("README.md has no single-host section between its markers")
	}
	var blocks [][2]string
	for _, m := range regexp.MustCompile("(?s)```(\\w+)\n(.*?)```").FindAllStringSubmatch(text[i:j], -1) {
		blocks = append(blocks, [2]string{m[1], m[2]})
	}
	return blocks
}

// shellWords splits a command line of the README: words separated by
// spaces, single quotes kept together.
func shellWords(line string) []string {
	var out []string
	var cur strings.Builder
	quoted, any := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, any = !quoted, true
		case r == ' ' && !quoted:
			if any {
				out = append(out, cur.String())
				cur.Reset()
				any = false
			}
		default:
			cur.WriteRune(r)
			any = true
		}
	}
	if any {
		out = append(out, cur.String())
	}
	return out
}

// TestREADMEWalkthrough runs the README's single-host walk-through as
// written: its certificate commands, its three config files and its
// commands, in an empty directory, with this build as `meshnode`.
func TestREADMEWalkthrough(t *testing.T) {
	for _, ip := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		for _, p := range []struct{ network, port string }{{"tcp", "7946"}, {"udp", "7946"}, {"udp", "7947"}, {"tcp", "7948"}} {
			addr := net.JoinHostPort(ip, p.port)
			var err error
			if p.network == "tcp" {
				var l net.Listener
				if l, err = net.Listen("tcp", addr); err == nil {
					_ = l.Close()
				}
			} else {
				var pc net.PacketConn
				if pc, err = net.ListenPacket("udp", addr); err == nil {
					_ = pc.Close()
				}
			}
			if err != nil {
				t.Skipf("the README's address %s/%s is taken on this host (%v): cannot run the walk-through as written", addr, p.network, err)
			}
		}
	}
	dir := t.TempDir()
	var commands []string
	for _, b := range readmeSection(t) {
		switch b[0] {
		case "toml":
			first, _, _ := strings.Cut(b[1], "\n")
			name := strings.TrimSpace(strings.TrimPrefix(first, "#"))
			if !strings.HasSuffix(name, ".toml") {
				t.Fatalf("a toml block of the walk-through does not start with its file name: %q", first)
			}
			writeConfig(t, filepath.Join(dir, name), b[1])
		case "sh":
			for _, line := range strings.Split(strings.TrimSpace(b[1]), "\n") {
				commands = append(commands, strings.TrimSpace(line))
			}
		}
	}
	if len(commands) < 8 {
		t.Fatalf("walk-through has %d commands", len(commands))
	}

	var daemons []*exec.Cmd
	var logs []*syncBuffer
	t.Cleanup(func() {
		for i, d := range daemons {
			_ = d.Process.Signal(syscall.SIGTERM)
			if err := d.Wait(); err != nil {
				t.Errorf("daemon %d: exit after SIGTERM: %v\n%s", i+1, err, logs[i].String())
			}
		}
	})
	run := func(args []string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, meshnodeBin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, line := range commands {
		words := shellWords(strings.TrimSuffix(line, "&"))
		if len(words) == 0 || words[0] != "meshnode" {
			t.Fatalf("walk-through line %q does not run meshnode", line)
		}
		args := words[1:]
		switch {
		case strings.HasSuffix(line, "&"):
			cmd := exec.Command(meshnodeBin, args...)
			cmd.Dir = dir
			buf := &syncBuffer{}
			cmd.Stdout, cmd.Stderr = buf, buf
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			daemons, logs = append(daemons, cmd), append(logs, buf)
		case args[0] == "members":
			var out string
			testutil.WaitFor(t, 30*time.Second, "meshnode members shows three alive nodes", func() bool {
				out, _ = run(args)
				return strings.Count(out, " alive ") == 3
			})
			for _, n := range []string{"edge1", "edge2", "edge3"} {
				if !strings.Contains(out, n) {
					t.Fatalf("members lacks %s:\n%s", n, out)
				}
			}
		default:
			out, err := run(args)
			if err != nil {
				var all strings.Builder
				for i, l := range logs {
					fmt.Fprintf(&all, "--- daemon %d\n%s", i+1, l.String())
				}
				t.Fatalf("%s: %v\n%s\n%s", line, err, out, all.String())
			}
			switch args[0] {
			case "send":
				if strings.TrimSpace(out) != "Delivered" {
					t.Fatalf("%s printed %q, want Delivered", line, out)
				}
			case "inbox":
				if !strings.Contains(out, `"body":{"id":42}`) {
					t.Fatalf("%s printed %q, want the message sent", line, out)
				}
			}
		}
	}
	if len(daemons) != 3 {
		t.Fatalf("walk-through started %d daemons, want 3", len(daemons))
	}
}

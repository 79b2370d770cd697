package testnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
)

// requireNetns skips tb where network namespaces cannot be made.
func requireNetns(tb testing.TB) {
	tb.Helper()
	if err := NetnsAvailable(); err != nil {
		tb.Skip("needs root and iproute2 for network namespaces: " + err.Error())
	}
}

func aliveNames(tb testing.TB, c *ProcCluster, i int) map[string]bool {
	tb.Helper()
	got, err := c.alive(i)
	if err != nil {
		return nil
	}
	return got
}

// TestProcNetnsPartition runs three daemons each in its own network
// namespace, isolates n2 by taking its link down, and shows a reliable
// send to it is Queued while cut off and delivered, once, after the link
// comes back.
func TestProcNetnsPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real meshnode daemons; runs without -short")
	}
	requireNetns(t)
	bin := buildMeshnode(t)
	c := NewProcs(t, bin, 3, WithNetns(), WithInboxes("box"))
	body := func(n int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)) }
	if out, err := c.Send(0, "box@n2", body(1), "p1"); err != nil || out != "Delivered" {
		t.Fatalf("send across namespaces: %q, %v", out, err)
	}

	if err := c.Isolate(2); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "n0 sees n2 gone and n2 sees itself alone", func() bool {
		a, b := aliveNames(t, c, 0), aliveNames(t, c, 2)
		return a != nil && !a["n2"] && len(a) == 2 && b != nil && len(b) == 1
	})
	if out, err := c.Send(0, "box@n2", body(2), "p2"); err != nil || out != "Queued" {
		t.Fatalf("send to an isolated node: %q, %v; want Queued", out, err)
	}
	if st, err := c.OutboxStats(0); err != nil || st.Depth != 1 {
		t.Fatalf("n0 outbox while n2 is cut off: %+v, %v; want depth 1", st, err)
	}
	if msgs, err := c.Pull(2, "box", 0, 10); err != nil || len(msgs) != 1 {
		t.Fatalf("n2 inbox while cut off: %d messages, %v; want only the first", len(msgs), err)
	}

	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the queued message reaches n2 after the link is up", func() bool {
		msgs, err := c.Pull(2, "box", 0, 10)
		return err == nil && len(msgs) >= 2
	})
	ctx, cancel := c.ctx()
	defer cancel()
	if err := c.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Pull(2, "box", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range msgs {
		keys = append(keys, m.Key)
	}
	if got := strings.Join(keys, ","); got != "p1,p2" {
		t.Fatalf("n2 inbox keys %s, want p1,p2 (in order, once each)", got)
	}
}

// TestProcNetnsCleanup shows Close deletes every namespace it made, also
// after a daemon was killed and a link left down.
func TestProcNetnsCleanup(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real meshnode daemons; runs without -short")
	}
	requireNetns(t)
	bin := buildMeshnode(t)
	c, err := StartProcs(t.Context(), bin, 2, WithNetns())
	if err != nil {
		t.Fatal(err)
	}
	prefix := "mnt-" + c.ns.id + "-"
	if n := countNetns(t, prefix); n != 3 {
		t.Fatalf("%d namespaces with prefix %s, want 3 (hub and two nodes)", n, prefix)
	}
	if err := c.Isolate(1); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(0); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := countNetns(t, prefix); n != 0 {
		t.Fatalf("%d namespaces with prefix %s left after Close", n, prefix)
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp dir %s left after Close: %v", c.Dir(), err)
	}
}

func countNetns(tb testing.TB, prefix string) int {
	tb.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		tb.Fatalf("ip netns list: %v", err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, prefix) {
			n++
		}
	}
	return n
}

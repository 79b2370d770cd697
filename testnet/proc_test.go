package testnet

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/testnet/internal/invariant"
)

// buildMeshnode builds the daemon without -race (the daemons are real
// processes; the race detector would only slow them) into tb's temp dir.
// The build cache makes every build after the first a link step.
func buildMeshnode(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "meshnode")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/meshnode/meshnode/cmd/meshnode").CombinedOutput()
	if err != nil {
		tb.Fatalf("build meshnode: %v\n%s", err, out)
	}
	return bin
}

// procMessages is K of the crash test; TESTNET_PROC_MESSAGES makes it larger.
func procMessages(tb testing.TB) int {
	tb.Helper()
	k := 300
	if v := os.Getenv("TESTNET_PROC_MESSAGES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 30 {
			tb.Fatalf("TESTNET_PROC_MESSAGES=%q: want a number >= 30", v)
		}
		k = n
	}
	return k
}

// lastCursor reads the newest cursor of an inbox from a stopped daemon's
// inbox.db: the messages its last incarnation stored.
func lastCursor(tb testing.TB, dataDir, box string) uint64 {
	tb.Helper()
	s, err := inbox.Open(inbox.DefaultConfig(filepath.Join(dataDir, "inbox.db")))
	if err != nil {
		tb.Fatalf("open inbox of a killed daemon: %v", err)
	}
	defer s.Close()
	return s.Stats()[box].LastCursor
}

// pullAll pages through an inbox until a page is empty.
func pullAll(tb testing.TB, c *ProcCluster, i int, box string) []InboxMessage {
	tb.Helper()
	var all []InboxMessage
	var after uint64
	for {
		page, err := c.Pull(i, box, after, 500)
		if err != nil {
			tb.Fatalf("pull %s on %s: %v", box, c.Name(i), err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].Cursor
	}
}

// TestProcCrashDurability sends K keyed reliable messages from n0 to
// box@n1 through n0's admin API while n0 (the sender) and later n1 (the
// receiver) are SIGKILLed and restarted. What either was told Delivered or
// Queued must end in n1's inbox, once per key, in send order.
func TestProcCrashDurability(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real meshnode daemons; runs without -short")
	}
	const seed = 7
	k := procMessages(t)
	bin := buildMeshnode(t)
	c := NewProcs(t, bin, 3, WithInboxes("box"))
	rec := NewRecorder(seed)
	const sender, to = "n0", "box@n1"

	var progress atomic.Int64 // sends done (any outcome)
	var queued atomic.Int64   // Queued outcomes
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for range k {
			seq := rec.Next(sender, to)
			key := fmt.Sprintf("k%05d", seq)
			out, err := c.Send(0, to, map[string]any{"seq": seq}, key)
			s := invariant.Sent{Sender: sender, Recipient: to, Key: key, Seq: seq, Outcome: invariant.Failed, Err: err}
			switch out {
			case "Delivered":
				s.Outcome = invariant.Delivered
			case "Queued":
				s.Outcome = invariant.Queued
				queued.Add(1)
			}
			rec.Sent(s)
			progress.Add(1)
			// A failed send (n0 killed under it) promises nothing; wait
			// until n0's admin API answers again before the next one.
			for err != nil {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				_, err = c.Members(0)
			}
		}
	}()

	testutil.WaitFor(t, 20*time.Second, "a third of the sends", func() bool { return progress.Load() >= int64(k/3) })
	if err := c.Kill(0); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}

	testutil.WaitFor(t, 20*time.Second, "two thirds of the sends", func() bool { return progress.Load() >= int64(2*k/3) })
	if err := c.Kill(1); err != nil {
		t.Fatal(err)
	}
	// The receiver's first incarnation stored exactly the cursors on disk
	// now: a key re-stored above this line is the documented crash window
	// (handler ran, key not yet durable), anything else is a duplicate.
	boundary := lastCursor(t, c.DataDir(1), "box")
	queuedBefore := queued.Load()
	testutil.WaitFor(t, 20*time.Second, "sends to the killed receiver are Queued", func() bool {
		return queued.Load() >= queuedBefore+int64(k/20)
	})
	if err := c.Restart(1); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "all sends done", func() bool { return progress.Load() == int64(k) })

	ctx, cancel := c.ctx()
	defer cancel()
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}

	msgs := pullAll(t, c, 1, "box")
	rec.Crashed("n1#1")
	for _, m := range msgs {
		var body struct{ Seq uint64 }
		if err := json.Unmarshal(m.Body, &body); err != nil {
			t.Fatalf("inbox message %d: body %s: %v", m.Cursor, m.Body, err)
		}
		if want := fmt.Sprintf("k%05d", body.Seq); m.Key != want {
			t.Fatalf("inbox message %d: key %q carries seq %d", m.Cursor, m.Key, body.Seq)
		}
		boot := "n1#2"
		if m.Cursor <= boundary {
			boot = "n1#1"
		}
		from := m.Sender[strings.LastIndex(m.Sender, "@")+1:]
		rec.Processed(invariant.Processed{Sender: from, Recipient: to, Key: m.Key, Seq: body.Seq, Boot: boot})
	}
	rep := rec.Check(nil) // nil: an acknowledged message in a DLQ counts as lost here
	t.Logf("K=%d, receiver boundary cursor %d, %d stored\n%s", k, boundary, len(msgs), rep)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.Delivered == 0 || rep.Queued == 0 {
		t.Fatalf("want both Delivered and Queued outcomes to be exercised: %d delivered, %d queued", rep.Delivered, rep.Queued)
	}
	if rep.Failed > 2 {
		// Only the request in flight when n0 was killed may fail.
		t.Fatalf("%d sends failed, want at most the one in flight at each kill", rep.Failed)
	}

	// Ack removes what was pulled; the inbox is then empty.
	if len(msgs) > 0 {
		n, err := c.Ack(1, "box", msgs[len(msgs)-1].Cursor)
		if err != nil || n != len(msgs) {
			t.Fatalf("ack all: deleted %d of %d: %v", n, len(msgs), err)
		}
	}
	if left := pullAll(t, c, 1, "box"); len(left) != 0 {
		t.Fatalf("%d messages left after acking all", len(left))
	}

	// SIGTERM is a clean exit 0; a stopped daemon refuses a second Stop.
	if err := c.Stop(2); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(2); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("second Stop: %v, want ErrNotRunning", err)
	}
	if !strings.Contains(c.Logs(2), "shutting down") {
		t.Fatalf("n2 log lacks the graceful shutdown line:\n%s", c.Logs(2))
	}
}

// TestProcClusterErrors covers bad input: no daemon has to start for any
// of it.
func TestProcClusterErrors(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "not-exec")
	if err := os.WriteFile(exe, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		bin  string
		n    int
		opts []ProcOption
		want error
	}{
		{"no nodes", exe, 0, nil, ErrBadIndex},
		{"missing binary", filepath.Join(t.TempDir(), "none"), 1, nil, ErrBadBinary},
		{"not executable", exe, 1, nil, ErrBadBinary},
		{"directory", t.TempDir(), 1, nil, ErrBadBinary},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := StartProcs(t.Context(), tt.bin, tt.n, tt.opts...)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
			if c != nil {
				t.Fatal("cluster returned with an error")
			}
		})
	}
	badOpts := []struct {
		name string
		opt  ProcOption
		want string
	}{
		{"converge", WithProcConvergeTimeout(0), "converge timeout"},
		{"log level", WithProcLogLevel("loud"), "log level"},
	}
	for _, tt := range badOpts {
		t.Run(tt.name, func(t *testing.T) {
			_, err := StartProcs(t.Context(), exe, 1, tt.opt)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to name %q", err, tt.want)
			}
		})
	}

	// Verbs on an empty (never started) cluster: errors, not panics.
	c := &ProcCluster{opts: defaultProcOptions(), dir: t.TempDir()}
	verbs := []struct {
		name string
		err  error
		want error
	}{
		{"kill", c.Kill(0), ErrBadIndex},
		{"stop", c.Stop(-1), ErrBadIndex},
		{"restart", c.Restart(3), ErrBadIndex},
		{"isolate", c.Isolate(0), ErrNoNetns},
		{"heal", c.Heal(), ErrNoNetns},
		{"members", func() error { _, err := c.Members(0); return err }(), ErrBadIndex},
		{"send", func() error { _, err := c.Send(0, "a@b", nil, ""); return err }(), ErrBadIndex},
	}
	for _, v := range verbs {
		if !errors.Is(v.err, v.want) {
			t.Errorf("%s: err %v, want %v", v.name, v.err, v.want)
		}
	}
	if c.Admin(0) != "" || c.Name(5) != "" || c.Running(0) {
		t.Error("accessors on a bad index must give zero values")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// A port probed free and taken by another process before the daemon binds
// it makes the daemon exit with "address in use"; StartProcs then starts
// the cluster again on other ports instead of failing.
func TestStartProcsRetriesATakenPort(t *testing.T) {
	bin := buildMeshnode(t)
	taken, err := net.ListenPacket("udp", "127.0.0.1:0") // QUIC's socket: the daemon's bind fails
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.LocalAddr().(*net.UDPAddr).Port
	var calls atomic.Int32
	pickPorts = func(k int) ([]int, error) {
		ports, err := freePorts(k)
		if err == nil && calls.Add(1) == 1 {
			ports[1] = port // the QUIC port of the first try
		}
		return ports, err
	}
	t.Cleanup(func() { pickPorts = freePorts })
	c, err := StartProcs(t.Context(), bin, 1)
	if err != nil {
		t.Fatalf("StartProcs with the first QUIC port taken: %v", err)
	}
	defer c.Close()
	if n := calls.Load(); n != 2 {
		t.Fatalf("ports picked %d times, want 2 (the taken one, then others)", n)
	}
	if !c.Running(0) {
		t.Fatal("the daemon is not running after StartProcs returned")
	}
}

package node_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/meshnode/meshnode/internal/storecheck"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// queueAndClose starts n1 on dir, queues k reliable messages for a node
// that is not there, and stops it (cleanly, or as a crash would).
func queueAndClose(t *testing.T, dir string, k int, crash bool) {
	t.Helper()
	cfg := testConfig(t, "n1", dir)
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < k; i++ {
		if out, err := n.TellReliable(ctxT(t), node.Addr("box", "away"), wrapperspb.Int64(int64(i))); err != nil || out != node.Queued {
			t.Fatalf("message %d: %v %v", i, out, err)
		}
	}
	if crash {
		err = n.Kill()
	} else {
		err = n.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestEmptiedStoreRefused: an outbox file truncated to nothing (a restore
// gone wrong, a full disk, a person) must not start empty in silence: 200
// queued messages would be gone.
func TestEmptiedStoreRefused(t *testing.T) {
	for _, how := range []string{"truncated", "removed"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			queueAndClose(t, dir, 200, false)
			path := filepath.Join(dir, "outbox.db")
			var err error
			if how == "truncated" {
				err = os.Truncate(path, 0)
			} else {
				err = os.Remove(path)
			}
			if err != nil {
				t.Fatal(err)
			}
			n, err := node.Open(testConfig(t, "n1", dir))
			if err == nil {
				_ = n.Close()
				t.Fatal("a node opened on an emptied outbox")
			}
			if !errors.Is(err, outbox.ErrLost) || !strings.Contains(err.Error(), "meshnode doctor") {
				t.Fatalf("err = %v, want ErrLost saying what to do", err)
			}
			// The operator's decision: start empty.
			if err := storecheck.Forget(path); err != nil {
				t.Fatal(err)
			}
			n, err = node.Open(testConfig(t, "n1", dir))
			if err != nil {
				t.Fatal(err)
			}
			if d := n.Outbox().Stats().Depth; d != 0 {
				t.Fatalf("depth %d after forgetting the store", d)
			}
			_ = n.Close()
		})
	}
}

// TestDamagedStoreRefusedWithoutCrash: pages of the outbox file that
// claim to be other pages made bbolt panic in a goroutine of its own (the
// process died). The node refuses the file with an error saying what to
// do, and what is readable can be salvaged into a file it opens.
func TestDamagedStoreRefusedWithoutCrash(t *testing.T) {
	dir := t.TempDir()
	queueAndClose(t, dir, 300, false)
	path := filepath.Join(dir, "outbox.db")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ps := os.Getpagesize()
	damaged := 0
	for p := 2; (p+1)*ps <= len(b); p++ {
		// Leaf pages with many elements: the queue's (about 20 records
		// of 200 bytes a page).
		if binary.NativeEndian.Uint16(b[p*ps+8:]) == 0x02 && binary.NativeEndian.Uint16(b[p*ps+10:]) >= 16 && damaged < 2 {
			binary.NativeEndian.PutUint64(b[p*ps:], 0)
			damaged++
		}
	}
	if damaged == 0 {
		t.Fatal("no queue page found to damage")
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(testConfig(t, "n1", dir))
	if err == nil {
		_ = n.Close()
		t.Fatal("a node opened on a damaged outbox")
	}
	if !errors.Is(err, outbox.ErrDamaged) || !strings.Contains(err.Error(), "--salvage") {
		t.Fatalf("err = %v, want ErrDamaged saying what to do", err)
	}
	// What `meshnode doctor --salvage` does.
	if err := os.Rename(path, path+".damaged"); err != nil {
		t.Fatal(err)
	}
	rep, err := storecheck.Salvage(path+".damaged", path)
	if err != nil {
		t.Fatal(err)
	}
	n, err = node.Open(testConfig(t, "n1", dir))
	if err != nil {
		t.Fatalf("open the salvaged outbox (%d keys copied): %v", rep.Keys, err)
	}
	defer func() { _ = n.Close() }()
	if d := n.Outbox().Stats().Depth; d == 0 || d >= 300 {
		t.Fatalf("salvaged outbox holds %d messages; want the readable part of 300", d)
	}
}

// TestUncleanShutdownIsCheckedInFull: after a crash (no clean-shutdown
// mark) the whole store is checked, and the node says so.
func TestUncleanShutdownIsCheckedInFull(t *testing.T) {
	for _, crash := range []bool{false, true} {
		dir := t.TempDir()
		queueAndClose(t, dir, 10, crash)
		var logs bytes.Buffer
		cfg := testConfig(t, "n1", dir)
		cfg.Logger = slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))
		n, err := node.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_ = n.Close()
		if got := strings.Contains(logs.String(), "did not close the store cleanly"); got != crash {
			t.Fatalf("crash %v: warning logged %v\n%s", crash, got, logs.String())
		}
	}
}

// syncWriter serialises writes to w (log lines come from several goroutines).
type syncWriter struct {
	mu sync.Mutex // mu guards w
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

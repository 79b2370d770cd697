package main

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/storecheck"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// makeOutbox writes an outbox of n queued messages into dir.
func makeOutbox(t *testing.T, dir string, n int) {
	t.Helper()
	st, err := outbox.Open(outbox.DefaultConfig(filepath.Join(dir, "outbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		seq, err := st.ReserveSequence()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Enqueue(context.Background(), &pb.StoredMessage{Envelope: &pb.Envelope{MsgId: "m", Recipient: "box@away", Sequence: seq}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

func exitOf(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestDoctor: a damaged outbox is reported (exit 1) and salvaged into a
// file the store opens; a lost one is reported and, on --forget, accepted.
func TestDoctor(t *testing.T) {
	dir := t.TempDir()
	makeOutbox(t, dir, 300)
	if out, _, err := cli(t, "", "doctor", "--data-dir", dir); err != nil || !strings.Contains(out, "outbox.db: ok") {
		t.Fatalf("healthy: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "outbox.db")
	// The sequence record beside it, which the store refuses to open on
	// when damaged.
	high, err := os.ReadFile(path + ".seq")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".seq", []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := cli(t, "", "doctor", "--data-dir", dir)
	if exitOf(err) != exitFailure || !strings.Contains(out, "outbox.db: damaged") || !strings.Contains(out, "does not hold a sequence") {
		t.Fatalf("damaged sequence record: exit %d\n%s", exitOf(err), out)
	}
	if err := os.WriteFile(path+".seq", high, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Damage a leaf the tree reaches: a leaf page an earlier commit freed
	// still looks like one, and the check rightly ignores it, so each
	// candidate is kept only if the check then refuses the file.
	ps := os.Getpagesize()
	damaged := false
	for p := 2; (p+1)*ps <= len(b) && !damaged; p++ {
		if binary.NativeEndian.Uint16(b[p*ps+8:]) != 0x02 || binary.NativeEndian.Uint16(b[p*ps+10:]) <= 20 {
			continue
		}
		id := binary.NativeEndian.Uint64(b[p*ps:])
		binary.NativeEndian.PutUint64(b[p*ps:], 0) // the page now says it is page 0
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := storecheck.Check(path); err != nil && strings.Contains(err.Error(), "says it is page 0") {
			damaged = true
			break
		}
		binary.NativeEndian.PutUint64(b[p*ps:], id)
	}
	if !damaged {
		t.Fatal("no leaf page of more than 20 keys is reachable in the outbox")
	}
	out, _, err = cli(t, "", "doctor", "--data-dir", dir)
	if exitOf(err) != exitFailure || !strings.Contains(out, "outbox.db: damaged") || !strings.Contains(out, "says it is page 0") {
		t.Fatalf("damaged: exit %d\n%s", exitOf(err), out)
	}
	out, _, err = cli(t, "", "doctor", "--data-dir", dir, "--salvage")
	if err != nil || !strings.Contains(out, "outbox.db: salvaged") || !strings.Contains(out, "kept") {
		t.Fatalf("salvage: %v\n%s", err, out)
	}
	st, err := outbox.Open(outbox.DefaultConfig(path))
	if err != nil {
		t.Fatalf("open the salvaged outbox: %v", err)
	}
	if d := st.Stats().Depth; d == 0 || d >= 300 {
		t.Errorf("salvaged outbox holds %d messages, want the readable part of 300", d)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	out, _, err = cli(t, "", "doctor", "--data-dir", dir)
	if exitOf(err) != exitFailure || !strings.Contains(out, "outbox.db: lost") {
		t.Fatalf("lost: exit %d\n%s", exitOf(err), out)
	}
	if out, _, err := cli(t, "", "doctor", "--data-dir", dir, "--forget"); err != nil || !strings.Contains(out, "forgotten") {
		t.Fatalf("forget: %v\n%s", err, out)
	}
	st, err = outbox.Open(outbox.DefaultConfig(path))
	if err != nil {
		t.Fatalf("open after forget: %v", err)
	}
	_ = st.Close()
}

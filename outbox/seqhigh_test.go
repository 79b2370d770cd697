package outbox_test

import (
	"os"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/storecheck"
	"github.com/meshnode/meshnode/outbox"
)

// An outbox file restored from a backup goes back to the sequence
// high-water it had then; the record beside it does not, so sequences
// handed out since the backup (which peers may have run) are not handed
// out again. Without the record (the whole directory restored) sequences
// continue from the file's own; a damaged record is refused.
func TestRestoredFileHandsOutNoSequenceAgain(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.SequenceBlock = 2 })
	reserve := func(n int) (last uint64) {
		t.Helper()
		for range n {
			seq, err := e.ReserveSequence()
			if err != nil {
				t.Fatal(err)
			}
			if seq <= last {
				t.Fatalf("sequence %d after %d", seq, last)
			}
			last = seq
		}
		return last
	}
	reserve(3)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	backup, err := os.ReadFile(e.path)
	if err != nil {
		t.Fatal(err)
	}
	e.Store = mustOpen(t, config(e.path, e.clk, e.mut))
	before := reserve(5)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.path, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	e.Store = mustOpen(t, config(e.path, e.clk, e.mut))
	if seq := reserve(1); seq <= before {
		t.Fatalf("after the restore: sequence %d, at or below %d handed out since the backup", seq, before)
	}

	// A record that is not a sequence, or one no store reaches (sequences
	// would wrap), is refused, saying what to do.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"x1\n", "18446744073709551615\n", "-3"} {
		if err := os.WriteFile(storecheck.HighPath(e.path), []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = outbox.Open(config(e.path, e.clk, e.mut))
		if err == nil || !strings.Contains(err.Error(), "does not hold a sequence") {
			t.Fatalf("open with the sequence record %q: %v", bad, err)
		}
	}
	if err := os.Remove(storecheck.HighPath(e.path)); err != nil {
		t.Fatal(err)
	}
	e.Store = mustOpen(t, config(e.path, e.clk, e.mut))
	if seq := reserve(1); seq <= before {
		t.Fatalf("without the record: sequence %d, at or below %d (the file's own record covers it now)", seq, before)
	}
}

// A sequence record that cannot be written stops no send: the store
// reserves from its file and says so; the next reservation writes it.
func TestUnwritableSequenceRecordStopsNoSend(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.SequenceBlock = 1 })
	tmp := storecheck.HighPath(e.path) + ".tmp"
	if err := os.Mkdir(tmp, 0o700); err != nil { // the record's temporary file cannot be made
		t.Fatal(err)
	}
	first, err := e.ReserveSequence()
	if err != nil {
		t.Fatalf("reserve with the record unwritable: %v", err)
	}
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	second, err := e.ReserveSequence()
	if err != nil || second <= first {
		t.Fatalf("reserve after: %d, %v (first %d)", second, err, first)
	}
	if h, err := storecheck.ReadHigh(e.path); err != nil || h != second {
		t.Fatalf("record %d (%v), want %d", h, err, second)
	}
}

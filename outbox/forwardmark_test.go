package outbox_test

import (
	"os"
	"testing"

	"github.com/meshnode/meshnode/outbox"
)

// MarkForwarding's answers across runs: nothing forwarded until a run
// does; after one that forwards, every later run counts what was stored
// before the first run that did not forward as possibly forwarded. An
// outbox file restored from a backup counts everything it holds so, and a
// run that forwards after the restore must write its mark into the file,
// which still holds the backup's (here: none): the store took the restore
// for a forwarding run already and wrote nothing, so the next run, no
// longer seeing a restore, read the backup's mark and counted nothing as
// forwarded.
func TestMarkForwardingAcrossRunsAndARestore(t *testing.T) {
	e := open(t, nil)
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(to, b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	mark := func(forwards bool) uint64 {
		t.Helper()
		below, err := e.MarkForwarding(forwards)
		if err != nil {
			t.Fatal(err)
		}
		return below
	}
	if below := mark(false); below != 0 {
		t.Fatalf("no run ever forwarded, yet messages below %d count as possibly forwarded", below)
	}
	backup := e.path + ".backup"
	e.reopen(t, func(*outbox.ManualClock) { copyFile(e.path, backup) })
	if _, err := e.ReserveSequence(); err != nil { // sequences handed out after the backup
		t.Fatal(err)
	}
	e.reopen(t, func(*outbox.ManualClock) { copyFile(backup, e.path) })
	if below := mark(false); below == 0 {
		t.Fatal("an outbox restored from a backup counts nothing it holds as possibly forwarded")
	}
	e.reopen(t, nil)
	first := mark(true)
	e.reopen(t, nil)
	second := mark(false)
	if second <= first {
		t.Fatalf("after a run that forwarded (its floor %d), the next run counts messages below %d as possibly forwarded, want a floor above it", first, second)
	}
	e.reopen(t, nil)
	if again := mark(false); again != second {
		t.Fatalf("a second run without forwarding answers %d, want the first one's %d", again, second)
	}

	// A restore, then a run that forwards, then one that does not.
	e.reopen(t, func(*outbox.ManualClock) { copyFile(backup, e.path) })
	mark(true)
	e.reopen(t, nil)
	if below := mark(false); below == 0 {
		t.Fatal("the run after a restore forwarded, but the next run counts nothing as possibly forwarded: the mark was not written into the restored file")
	}
}

package outbox_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/outbox"
)

// reserve returns n sequences from s, failing tb on an error.
func reserve(tb testing.TB, s *outbox.Store, n int) []uint64 {
	tb.Helper()
	seqs := make([]uint64, n)
	for i := range seqs {
		seq, err := s.ReserveSequence()
		if err != nil {
			tb.Fatal(err)
		}
		seqs[i] = seq
	}
	return seqs
}

// An outbox restored from a backup together with the sequence record
// beside it (a whole data directory) goes back to the sequences of the
// backup's time; each block of sequences starts no lower than the wall
// clock in microseconds, so once the clock is later than when the outbox
// last ran, the restored outbox hands out none of the sequences it handed
// out after the backup.
func TestRestoredOutboxAndRecordHandOutNoSequenceAgainOnALaterClock(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.SequenceBlock = 1 << 16 })
	first := reserve(t, e.Store, 1)[0]
	if want := uint64(epoch0.UnixMicro()); first < want {
		t.Fatalf("first sequence %d, want at least the clock's %d µs", first, want)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "outbox.db")
	testutil.CopyFile(t, e.path, backup)
	testutil.CopyFile(t, e.path+".seq", backup+".seq")

	// After the backup: a restart and 100,000 sequences in two blocks,
	// within one second of the clock.
	e.clk.Advance(time.Second)
	e.Store = mustOpen(t, config(e.path, e.clk, e.mut))
	after := reserve(t, e.Store, 100_000)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// The whole store restored, one second after the outbox last ran.
	testutil.CopyFile(t, backup, e.path)
	testutil.CopyFile(t, backup+".seq", e.path+".seq")
	e.clk.Advance(time.Second)
	e.Store = mustOpen(t, config(e.path, e.clk, e.mut))
	if got, top := reserve(t, e.Store, 1)[0], after[len(after)-1]; got <= top {
		t.Fatalf("restored outbox handed out %d, at or below %d, handed out after the backup", got, top)
	}
}

// A wall clock that tells nothing (before 1970, never set) or an absurd
// one (past the year 70,000) puts no floor under the sequences: they are
// the outbox's counter, one block after another. A clock stepped back
// never makes them go back.
func TestSequenceFloorIgnoresClocksThatTellNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		wall time.Time
	}{
		{"before 1970", time.Unix(0, 0).Add(-time.Hour)},
		{"at 1970", time.Unix(0, 0)},
		{"past the year 70,000", time.UnixMicro(outbox.MaxSequence/4 + 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := outbox.NewManualClock(c.wall)
			s := mustOpen(t, config(filepath.Join(t.TempDir(), "outbox.db"), clk, func(c *outbox.Config) { c.SequenceBlock = 4 }))
			defer s.Close()
			if got := reserve(t, s, 9); got[0] != 1 || got[8] != 9 {
				t.Fatalf("sequences %v, want 1 to 9", got)
			}
		})
	}
	t.Run("stepped back", func(t *testing.T) {
		e := open(t, func(c *outbox.Config) { c.SequenceBlock = 4 })
		last := reserve(t, e.Store, 5)[4]
		e.clk.Step(-24 * time.Hour)
		if got := reserve(t, e.Store, 8); got[0] != last+1 || got[7] != last+8 {
			t.Fatalf("after the clock went back a day: %v, want %d to %d", got, last+1, last+8)
		}
	})
}

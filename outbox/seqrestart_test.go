package outbox_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/outbox"
)

// Every start skips the rest of the block reserved before it, so after
// restarts an outbox's sequences run ahead of the clock, by at most a
// block (65,536 µs with the clock set, whatever SequenceBlock says) for
// each start sooner than that after the one before: a restore of the
// outbox with its sequence record, once the clock is past that, hands out
// no sequence again. (With blocks as large as SequenceBlock allows, one
// restart put them 71 minutes ahead, and a restore a minute later reused
// them.)
func TestRestoreAfterRestartsHandsOutNoSequenceAgain(t *testing.T) {
	for _, c := range []struct {
		name     string
		block    uint64
		restarts int
		between  time.Duration // clock time between two starts
		restore  time.Duration // clock time from the last run to the restore
	}{
		{"largest block, one restart, restored a second later", 1 << 32, 1, time.Second, time.Second},
		{"2^24 block, one restart, restored a second later", 1 << 24, 1, time.Second, time.Second},
		// A crash loop restarting every 10 ms: 100 × (65.5 - 10) ms ahead.
		{"default block, 100 restarts 10 ms apart, restored 6 s later", 1 << 16, 100, 10 * time.Millisecond, 6 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := open(t, func(cfg *outbox.Config) { cfg.SequenceBlock = c.block })
			reserve(t, e.Store, 1)
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			backup := filepath.Join(t.TempDir(), "outbox.db")
			testutil.CopyFile(t, e.path, backup)
			testutil.CopyFile(t, e.path+".seq", backup+".seq")

			var top uint64
			for range c.restarts {
				e.clk.Advance(c.between)
				e.Store = mustOpen(t, config(e.path, e.clk, e.mut))
				top = reserve(t, e.Store, 1)[0] // one message sent each run
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
			}
			ahead := time.Duration(int64(top)-e.clk.Now().UnixMicro()) * time.Microsecond
			if bound := time.Duration(c.restarts) * max(0, 1<<16*time.Microsecond+time.Microsecond-c.between); ahead > bound {
				t.Fatalf("after %d starts %v apart, the last sequence handed out is %v ahead of the clock, want at most %v", c.restarts, c.between, ahead, bound)
			}

			// The whole store restored, at a later clock than the outbox last ran.
			testutil.CopyFile(t, backup, e.path)
			testutil.CopyFile(t, backup+".seq", e.path+".seq")
			e.clk.Advance(c.restore)
			e.Store = mustOpen(t, config(e.path, e.clk, e.mut))
			defer e.Close()
			if got := reserve(t, e.Store, 1)[0]; got <= top {
				t.Fatalf("restored outbox (clock %v after it last ran) handed out %d, at or below %d, handed out after the backup",
					c.restore, got, top)
			}
		})
	}
}

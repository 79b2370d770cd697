package outbox

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
)

// While the disk refuses writes, a coalesce key updated by direct
// deliveries gets a RecordVersion per version. Only the newest version of
// a (recipient, key) matters (older ones never lower it), so one note per
// key is kept for the next commit; keeping every one would grow memory and
// the work of each refused commit with the deliveries, for as long as the
// disk stays full.
func TestKeptVersionNotesDoNotGrowPerDelivery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	cfg := DefaultConfig(path)
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	restore, hits := faults.FailCommits(path, errors.New("write outbox.db: no space left on device"))
	defer restore()
	const n = 2000
	for i := 1; i <= n; i++ {
		s.RecordVersion("a@n1", "k", uint64(i))
	}
	// A last op to be sure every note went through a refused commit.
	if err := s.Ack("sync@none", []uint64{1}); err == nil {
		t.Fatal("Ack on a full disk succeeded")
	}
	testutil.WaitFor(t, 10*time.Second, "refused commits", func() bool { return hits() > 0 })
	restore()
	s.closeMu.Lock()
	s.isClosed = true
	close(s.closing)
	s.closeMu.Unlock()
	<-s.stopped // the committer is done: unwritten is ours to read
	kept := len(s.unwritten)
	_ = s.db.Close()
	if kept > 1 {
		t.Fatalf("%d version notes of one (recipient, key) kept for the next commit, want 1 (the newest)", kept)
	}
}

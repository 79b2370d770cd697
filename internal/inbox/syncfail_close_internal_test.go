package inbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/storecheck"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	bolt "go.etcd.io/bbolt"
)

// boltStatlock is bbolt's internal stats lock, which a failed write
// transaction takes right after it released the writer lock (Tx.close):
// holding it pauses the failing writer between the end of its db.Update
// and update's check of the file (s.db.View), the window in which a
// concurrent Close runs to the end.
func boltStatlock(t *testing.T, db *bolt.DB) *sync.RWMutex {
	v := reflect.ValueOf(db).Elem().FieldByName("statlock")
	if !v.IsValid() || v.Type() != reflect.TypeFor[sync.RWMutex]() {
		t.Fatal("bbolt.DB has no statlock of the known type: this test's pause needs updating for this bbolt")
	}
	return (*sync.RWMutex)(unsafe.Pointer(v.UnsafeAddr()))
}

// A Close that runs while an append's commit fails after bbolt wrote it
// (its fsync failing) must not mark the file clean: the commit is in the
// file and the disk may not keep it. update's check of the file (a read
// transaction after the failed commit) would fail silently once Close
// closed the database, so Close waits for it (wmu), and the store learns
// it failed before Close decides whether the shutdown was clean.
func TestCloseDuringAFailingCommitIsNotClean(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	syncErr := errors.New("fdatasync inbox.db: input/output error")
	var armed atomic.Bool
	inCommit := make(chan struct{})
	var statlock *sync.RWMutex
	defer faults.FailWrites(path, syncErr, func(meta bool) bool {
		if meta && armed.CompareAndSwap(true, false) {
			statlock.Lock() // released by the test once Close returned
			close(inCommit)
			return true
		}
		return false
	})()
	s, err := Open(DefaultConfig(path))
	if err != nil {
		t.Fatal(err)
	}
	statlock = boltStatlock(t, s.db)
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	appendErr := make(chan error, 1)
	go func() {
		_, err := s.Append(context.Background(), "box", &pb.Envelope{MsgId: "m1"})
		appendErr <- err
	}()
	<-inCommit
	// Shutdown while the failing commit is under way. Close must wait for
	// update to learn whether bbolt wrote it: the failing writer is held
	// between its commit and that check until Close has begun.
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	testutil.WaitFor(t, 10*time.Second, "Close to begin", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed
	})
	statlock.Unlock()
	closeErr := <-closed
	aerr := <-appendErr
	t.Logf("append: %v; close: %v; Err(): %v", aerr, closeErr, s.Err())

	// The failed commit is in the file.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	_ = db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket([]byte(prefixQueue + "box")).Stats().KeyN
		return nil
	})
	_ = db.Close()
	if n != 1 {
		t.Fatalf("the file holds %d messages; this test needs the failed commit in it", n)
	}
	if _, err := os.Stat(storecheck.CleanPath(path)); err == nil {
		t.Fatalf("Close marked the file clean although its last commit failed after bbolt wrote it (append said %v, Err() = %v): the next Open skips the whole-file check", aerr, s.Err())
	}
}

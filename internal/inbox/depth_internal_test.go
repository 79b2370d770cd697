package inbox

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// An inbox's depth counts what is stored, not appends still waiting for
// their commit; those hold a slot toward MaxMessages all the same.
func TestDepthCountsStoredMessagesOnly(t *testing.T) {
	cfg := DefaultConfig(filepath.Join(t.TempDir(), "inbox.db"))
	cfg.MaxMessages = 2
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(context.Background(), "box", &pb.Envelope{MsgId: "a"}); err != nil {
		t.Fatal(err)
	}
	// Hold the file's write lock: the next append waits for its commit.
	locked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free() // before Close, which waits for the lock, also when the test fails
	go func() {
		_ = s.db.Update(func(*bolt.Tx) error {
			close(locked)
			<-release
			return nil
		})
	}()
	<-locked
	done := make(chan error, 1)
	go func() {
		_, err := s.Append(context.Background(), "box", &pb.Envelope{MsgId: "b"})
		done <- err
	}()
	testutil.WaitFor(t, 5*time.Second, "b's slot held", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.boxes["box"].held == 1
	})
	if d := s.Stats()["box"].Depth; d != 1 {
		t.Fatalf("depth %d while b waits for its commit, want 1 (a)", d)
	}
	if _, err := s.Append(context.Background(), "box", &pb.Envelope{MsgId: "c"}); !errors.Is(err, ErrFull) {
		t.Fatalf("c with a stored and b's slot held (the bound is 2): %v, want ErrFull", err)
	}
	free()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := s.Stats()["box"].Depth; d != 2 {
		t.Fatalf("depth %d after b's commit, want 2", d)
	}
}

package inbox_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// A long poll waiting when the store stops (a commit written but not
// synced) is woken and fails with ErrFailed, as every Pull does from then
// on, instead of sitting out its whole wait and reporting an empty,
// successful result.
func TestLongPollEndsWhenTheStoreStops(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	syncErr := errors.New("fdatasync inbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(path, syncErr, func(meta bool) bool { return meta && failing.Load() })()
	s := openStore(t, path, nil)
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const wait = 3 * time.Second
	type result struct {
		msgs []*pb.Envelope
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		t0 := time.Now()
		msgs, err := s.Pull(ctx, "box", 0, 10, wait)
		done <- result{msgs, err, time.Since(t0)}
	}()
	<-started
	testutil.WaitFor(t, 10*time.Second, "the pull to wait", func() bool {
		buf := make([]byte, 1<<20)
		st := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(st, "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "inbox.(*Store).Pull") {
				return true
			}
		}
		return false
	})
	failing.Store(true)
	if _, err := s.Append(ctx, "box", env("m1")); !errors.Is(err, inbox.ErrFailed) {
		t.Fatalf("append: %v, want ErrFailed", err)
	}
	r := <-done
	if !errors.Is(r.err, inbox.ErrFailed) {
		t.Fatalf("long poll pending when the store stopped returned %d messages, err %v after %v; want ErrFailed at once", len(r.msgs), r.err, r.took.Round(time.Millisecond))
	}
}

package inbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/storecheck"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// errSync is what a failing fsync of the inbox file reports.
var errSync = errors.New("fdatasync inbox.db: input/output error")

// syncFailing opens an inbox store with the inbox "box" whose writes of
// bbolt's meta page reach the file and then fail with errSync (a failing
// fsync) while failing is set.
func syncFailing(t *testing.T) (s *inbox.Store, path string, failing *atomic.Bool) {
	path = filepath.Join(t.TempDir(), "inbox.db")
	failing = new(atomic.Bool)
	t.Cleanup(faults.FailWrites(path, errSync, func(meta bool) bool { return meta && failing.Load() }))
	s = openStore(t, path, nil)
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	return s, path, failing
}

// An inbox whose disk fails a commit bbolt had already written (the meta
// page's fsync) stops: that append and every later write and pull fail
// with ErrFailed (also ErrWrite, so a reliable sender backs off instead of
// counting a failure), even once the disk takes writes again. Reopened, it
// holds what the file holds, the failed append included, and a marked
// copy of that message is not stored twice.
func TestInboxWrittenButNotSyncedStops(t *testing.T) {
	s, path, failing := syncFailing(t)
	stream := []byte("stream-1")
	ctx := context.Background()
	if _, err := s.AppendMarked(ctx, "box", env("m1"), inbox.Mark{Stream: stream, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if got := s.Applied(stream); got != 1 {
		t.Fatalf("Applied = %d, want 1", got)
	}
	failing.Store(true)
	_, err := s.AppendMarked(ctx, "box", env("m2"), inbox.Mark{Stream: stream, Seq: 2})
	if !errors.Is(err, inbox.ErrFailed) || !errors.Is(err, inbox.ErrWrite) || !errors.Is(err, errSync) {
		t.Fatalf("append whose commit was written but not synced: %v, want ErrFailed and ErrWrite wrapping the disk's error", err)
	}
	failing.Store(false)
	if _, _, err := s.AppendBatchMarked(ctx, "box", []*pb.Envelope{env("m3")}, []inbox.Mark{{Stream: stream, Seq: 3}}); !errors.Is(err, inbox.ErrFailed) {
		t.Fatalf("append after the failure: %v, want ErrFailed", err)
	}
	if _, err := s.AckUpTo("box", 1); !errors.Is(err, inbox.ErrFailed) {
		t.Fatalf("ack after the failure: %v, want ErrFailed", err)
	}
	if _, err := s.Pull(ctx, "box", 0, 10, 0); !errors.Is(err, inbox.ErrFailed) {
		t.Fatalf("pull after the failure: %v, want ErrFailed", err)
	}
	if _, err := s.Declare("other"); !errors.Is(err, inbox.ErrFailed) {
		t.Fatalf("declare after the failure: %v, want ErrFailed", err)
	}
	if err := s.Err(); !errors.Is(err, inbox.ErrFailed) {
		t.Fatalf("Err() = %v, want ErrFailed", err)
	}
	if got := s.Applied(stream); got != 0 {
		t.Fatalf("Applied after the failure = %d, want 0: the file's word is not trusted (the node's watermark stands)", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(storecheck.CleanPath(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close of the failed store marked it clean (%v): the next Open would not check the whole file", err)
	}

	s = openStore(t, path, nil)
	if err := s.Err(); err != nil {
		t.Fatalf("Err() after reopening: %v", err)
	}
	if _, err := s.AppendMarked(ctx, "box", env("m2 again"), inbox.Mark{Stream: stream, Seq: 2}); err != nil {
		t.Fatalf("the sender's copy of m2 after reopening: %v", err)
	}
	msgs, err := s.Pull(ctx, "box", 0, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(msgs); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("inbox after reopening = %v, want what the file holds, once each: [m1 m2]", got)
	}
}

// A commit that failed before bbolt wrote its meta page (a full disk) is
// not in the file: the append fails with ErrWrite, not ErrFailed, and the
// inbox takes it once the disk does.
func TestInboxCommitFailingBeforeItsMetaPageGoesOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	full := errors.New("write inbox.db: no space left on device")
	var failing atomic.Bool
	defer faults.FailWrites(path, full, func(meta bool) bool { return !meta && failing.Load() })()
	s := openStore(t, path, nil)
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	if _, err := s.Append(context.Background(), "box", env("m1")); !errors.Is(err, inbox.ErrWrite) || errors.Is(err, inbox.ErrFailed) {
		t.Fatalf("append on a full disk: %v, want ErrWrite and not ErrFailed", err)
	}
	failing.Store(false)
	appendN(t, s, "box", 2, 1)
	msgs, err := s.Pull(context.Background(), "box", 0, 10, 0)
	if err != nil || !slices.Equal(ids(msgs), []string{"m2"}) {
		t.Fatalf("pull after the disk recovered: %v %v, want [m2]", ids(msgs), err)
	}
}

// A long poll waiting when the store stops (a commit written but not
// synced) is woken and fails with ErrFailed, as every Pull does from then
// on, instead of sitting out its whole wait and reporting an empty,
// successful result.
func TestLongPollEndsWhenTheStoreStops(t *testing.T) {
	s, _, failing := syncFailing(t)
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

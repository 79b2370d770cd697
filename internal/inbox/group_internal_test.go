package inbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// Appends that queue while a commit runs share the next one, and a call
// that fails in it fails alone: one whose message cannot be encoded, or
// one whose append panics (a nil envelope), which runs in whichever
// goroutine leads the commit, perhaps an innocent caller's. The others of
// its commit are stored, no caller sees the panic, and the group goes on:
// a later append is served.
func TestGroupedAppendFailsAlone(t *testing.T) {
	for _, bad := range []struct {
		name string
		env  *pb.Envelope
	}{
		{"unencodable", &pb.Envelope{MsgId: "bad", Type: "\xff"}}, // not UTF-8
		{"panics", nil},
	} {
		t.Run(bad.name, func(t *testing.T) {
			s, err := Open(DefaultConfig(filepath.Join(t.TempDir(), "inbox.db")))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			if _, err := s.Declare("box"); err != nil {
				t.Fatal(err)
			}
			type result struct {
				id       string
				err      error
				panicked any
			}
			results := make(chan result, 4)
			appendOne := func(id string, e *pb.Envelope) {
				go func() {
					r := result{id: id}
					defer func() {
						r.panicked = recover()
						results <- r
					}()
					_, r.err = s.Append(context.Background(), "box", e)
				}()
			}
			queued := func(n int) func() bool {
				return func() bool {
					s.gmu.Lock()
					defer s.gmu.Unlock()
					return len(s.gqueue) == n
				}
			}
			// The first append leads and waits for the write lock held
			// here; the next two queue behind it and share the commit after,
			// led by the first of them.
			s.wmu.Lock()
			unlock := sync.OnceFunc(s.wmu.Unlock)
			defer unlock() // before Close, which waits for the lock, also when the test fails
			appendOne("a", &pb.Envelope{MsgId: "a"})
			testutil.WaitFor(t, 10*time.Second, "the first append to lead", func() bool {
				s.gmu.Lock()
				defer s.gmu.Unlock()
				return s.grunning && len(s.gqueue) == 0
			})
			appendOne("c", &pb.Envelope{MsgId: "c"})
			testutil.WaitFor(t, 10*time.Second, "the second append to queue", queued(1))
			appendOne("bad", bad.env) // run by c's goroutine, which leads the next commit
			testutil.WaitFor(t, 10*time.Second, "the bad append to queue", queued(2))
			unlock()

			got := map[string]result{}
			for range 3 {
				select {
				case r := <-results:
					got[r.id] = r
				case <-time.After(10 * time.Second):
					t.Fatalf("only %v answered: the group is wedged", got)
				}
			}
			for id, r := range got {
				if r.panicked != nil {
					t.Errorf("%s's caller saw a panic: %v", id, r.panicked)
				}
			}
			if got["a"].err != nil || got["c"].err != nil || got["bad"].err == nil {
				t.Fatalf("results %v: want a and c stored, bad refused", got)
			}
			appendOne("d", &pb.Envelope{MsgId: "d"})
			select {
			case r := <-results:
				if r.err != nil || r.panicked != nil {
					t.Fatalf("a later append: %v, panic %v", r.err, r.panicked)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a later append was never served: the group is wedged")
			}
			msgs, err := s.Pull(context.Background(), "box", 0, 10, 0)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range msgs {
				ids = append(ids, m.GetMsgId())
			}
			if !slices.Equal(ids, []string{"a", "c", "d"}) {
				t.Fatalf("stored %v, want [a c d]", ids)
			}
		})
	}
}

// Appends that queue while a commit runs share the next commit: ten
// appends to ten inboxes behind a stalled leader take one commit between
// them, not ten (each commit writes bbolt's meta page once).
func TestQueuedAppendsShareOneCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	var commits atomic.Int64
	defer faults.FailWrites(path, errors.New("unused"), func(meta bool) bool {
		if meta {
			commits.Add(1)
		}
		return false
	})()
	s, err := Open(DefaultConfig(path))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	const n = 10
	for i := range n + 1 {
		if _, err := s.Declare(fmt.Sprint("box", i)); err != nil {
			t.Fatal(err)
		}
	}
	s.wmu.Lock()
	unlock := sync.OnceFunc(s.wmu.Unlock)
	defer unlock()
	var wg sync.WaitGroup
	appendTo := func(i int) {
		wg.Go(func() {
			if _, err := s.Append(context.Background(), fmt.Sprint("box", i), &pb.Envelope{MsgId: fmt.Sprint(i)}); err != nil {
				t.Error(err)
			}
		})
	}
	appendTo(n) // the leader, waiting for the lock held here
	testutil.WaitFor(t, 10*time.Second, "the first append to lead", func() bool {
		s.gmu.Lock()
		defer s.gmu.Unlock()
		return s.grunning && len(s.gqueue) == 0
	})
	for i := range n {
		appendTo(i)
	}
	testutil.WaitFor(t, 10*time.Second, "the others to queue", func() bool {
		s.gmu.Lock()
		defer s.gmu.Unlock()
		return len(s.gqueue) == n
	})
	before := commits.Load()
	unlock()
	wg.Wait()
	if got := commits.Load() - before; got != 2 {
		t.Fatalf("%d appends took %d commits, want 2: the leader's, then one for the %d that queued behind it", n+1, got, n)
	}
}

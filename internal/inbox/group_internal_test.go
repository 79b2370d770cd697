package inbox

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// Appends that queue while a commit runs share the next one, and a call
// that fails in it (a message that cannot be encoded) fails alone: the
// others of its commit are stored.
func TestGroupedAppendFailsAlone(t *testing.T) {
	s, err := Open(DefaultConfig(filepath.Join(t.TempDir(), "inbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The first append leads and waits for the write lock held here; the
	// next two queue behind it and share the commit after.
	s.wmu.Lock()
	locked := true
	defer func() {
		if locked {
			s.wmu.Unlock()
		}
	}()
	type result struct {
		id  string
		err error
	}
	results := make(chan result, 3)
	appendOne := func(id, typ string) {
		go func() {
			_, err := s.Append(ctx, "box", &pb.Envelope{MsgId: id, Type: typ})
			results <- result{id, err}
		}()
	}
	queued := func(n int) func() bool {
		return func() bool {
			s.gmu.Lock()
			defer s.gmu.Unlock()
			return len(s.gqueue) == n
		}
	}
	appendOne("a", "ok")
	testutil.WaitFor(t, 10*time.Second, "the first append to take the queue", queued(0))
	appendOne("bad", "\xff") // not UTF-8: the envelope cannot be encoded
	testutil.WaitFor(t, 10*time.Second, "the bad append to queue", queued(1))
	appendOne("c", "ok")
	testutil.WaitFor(t, 10*time.Second, "the third append to queue", queued(2))
	s.wmu.Unlock()
	locked = false

	errs := map[string]error{}
	for range 3 {
		r := <-results
		errs[r.id] = r.err
	}
	if errs["a"] != nil || errs["c"] != nil || errs["bad"] == nil {
		t.Fatalf("results %v: want a and c stored, bad refused", errs)
	}
	msgs, err := s.Pull(ctx, "box", 0, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, m.GetMsgId())
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "c" {
		t.Fatalf("stored %v, want [a c]", got)
	}
}

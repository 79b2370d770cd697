package inbox

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// An append whose fn panics (here a nil envelope) inside a shared commit
// runs in whichever goroutine leads that commit, perhaps an innocent
// caller's: the panic is that call's error alone, the others of the
// commit are stored, and the group goes on (no caller waits forever, and
// later appends are taken).
func TestPanickingAppendFailsAlone(t *testing.T) {
	s, err := Open(DefaultConfig(filepath.Join(t.TempDir(), "inbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	type result struct {
		id       string
		panicked any
		err      error
	}
	results := make(chan result, 4)
	appendOne := func(id string, e *pb.Envelope) {
		go func() {
			r := result{id: id}
			defer func() {
				r.panicked = recover()
				results <- r
			}()
			_, r.err = s.Append(ctx, "box", e)
		}()
	}
	queued := func(n int) func() bool {
		return func() bool {
			s.gmu.Lock()
			defer s.gmu.Unlock()
			return len(s.gqueue) == n
		}
	}
	s.wmu.Lock()
	appendOne("a", &pb.Envelope{MsgId: "a"})
	testutil.WaitFor(t, 10*time.Second, "a to lead", queued(0))
	appendOne("c", &pb.Envelope{MsgId: "c"})
	testutil.WaitFor(t, 10*time.Second, "c to queue", queued(1))
	appendOne("nil", nil)
	testutil.WaitFor(t, 10*time.Second, "nil to queue", queued(2))
	s.gmu.Lock()
	nilCall := s.gqueue[1]
	s.gmu.Unlock()
	s.wmu.Unlock()

	got := map[string]result{}
	for range 2 {
		r := <-results
		got[r.id] = r
	}
	var msgs []string
	for id, r := range got {
		msgs = append(msgs, fmt.Sprintf("%s: err %v panic %v", id, r.err, r.panicked))
	}
	t.Logf("returned: %v", msgs)
	if r, ok := got["c"]; ok && r.panicked != nil {
		t.Errorf("c, a valid append, panicked with the nil envelope's fault: %v", r.panicked)
	}
	// A later append must still be served.
	appendOne("d", &pb.Envelope{MsgId: "d"})
	deadline := time.After(5 * time.Second)
	select {
	case r := <-results:
		t.Logf("%s: err %v panic %v", r.id, r.err, r.panicked)
	case <-deadline:
		s.gmu.Lock()
		t.Errorf("a later append hangs: grunning %v, %d queued, the nil append never answered", s.grunning, len(s.gqueue))
		// Free the stuck goroutines so that the test ends.
		if len(s.gqueue) > 0 {
			s.gqueue[0].wake <- false
		}
		s.gmu.Unlock()
		nilCall.finish(fmt.Errorf("freed by the test"))
		for range 2 {
			<-results
		}
	}
}

package node_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/testnet"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Two versions of one coalesce key in the dead-letter queue, both refused
// on Send's direct attempt (so never queued): replaying them all runs the
// newest and leaves the older one in the queue as superseded. A version
// sent that way is in the coalesce index as a queued one is (noted before
// its attempt, and with its dead letter); before, it was not, Replay took
// the older first, gave it a new (and higher) sequence that the index
// recorded, and then refused the newer as superseded by it, now and on
// every later Replay: the older version won.
func TestReplayOfEveryDeadLetteredVersionRunsTheNewest(t *testing.T) {
	s := &coalesceSink{}
	s.refuse = func(string, int) bool { return true }
	c, to := s.cluster(t)
	for _, v := range []string{"v1", "v2"} {
		if out, err := c.Node(0).TellReliable(ctxT(t), to, wrapperspb.String(v), node.WithOverwrite("config")); err != nil || out != node.DeadLettered {
			t.Fatalf("%s: %v %v, want DeadLettered", v, out, err)
		}
	}
	s.mu.Lock()
	s.refuse = func(string, int) bool { return false }
	s.mu.Unlock()
	n, err := c.Node(0).Outbox().Replay(outbox.DLQFilter{Recipient: to.String()})
	if n != 1 || err != nil {
		t.Fatalf("replaying both: %d, %v; want 1 (the newest) and no error", n, err)
	}
	testutil.WaitFor(t, 10*time.Second, "the replay ran", func() bool { return len(s.runs()) > 0 })
	if err := c.WaitDrained(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := s.runs(); !slices.Equal(got, []string{"v2"}) {
		t.Fatalf("after replaying both dead-lettered versions of coalesce key \"config\", cfg ran %v, want [v2]", got)
	}
	dl, err := c.Node(0).Outbox().DeadLetters(outbox.DLQFilter{Recipient: to.String()})
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead letters left: %v (%v), want v1's alone", dl, err)
	}
	if n, err := c.Node(0).Outbox().Replay(outbox.DLQFilter{Recipient: to.String()}); n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replaying v1 after v2: %d, %v; want 0 and ErrSuperseded", n, err)
	}
}

// Replay of an older version's dead letter while Send's direct attempt of
// a newer version is running: the newer version was noted in the coalesce
// index before its attempt, so the older one is refused (ErrSuperseded)
// and never runs after the newer one. Before, the newer version was noted
// only once delivered, the older one was taken back at a sequence above
// it, and ran after it.
func TestReplayDuringANewerVersionsDirectAttemptIsRefused(t *testing.T) {
	inV2, v2Leave := make(chan struct{}), make(chan struct{})
	s := &coalesceSink{refuse: firstV1}
	s.hold = func(v string) {
		if v == "v2" {
			close(inV2)
			<-v2Leave // the handler takes a while
		}
	}
	c, to := s.cluster(t)
	if out, err := c.Node(0).TellReliable(ctxT(t), to, wrapperspb.String("v1"), node.WithOverwrite("config")); err != nil || out != node.DeadLettered {
		t.Fatalf("v1: %v %v, want DeadLettered", out, err)
	}
	type result struct {
		out node.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := c.Node(0).TellReliable(ctxT(t), to, wrapperspb.String("v2"), node.WithOverwrite("config"))
		done <- result{out, err}
	}()
	<-inV2 // v2's direct attempt is running at the receiver
	n, err := c.Node(0).Outbox().Replay(outbox.DLQFilter{Recipient: to.String()})
	close(v2Leave)
	r := <-done
	if n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replaying v1 while v2's direct attempt runs: %d, %v; want 0 and ErrSuperseded", n, err)
	}
	if r.err != nil || r.out != node.Delivered {
		t.Fatalf("v2: %v %v, want Delivered", r.out, r.err)
	}
	if got := s.runs(); !slices.Equal(got, []string{"v2"}) {
		t.Fatalf("cfg ran %v, want [v2]", got)
	}
}

// A version delivered by a direct attempt is never stored, so the outbox's
// coalesce index, which makes Replay refuse an older version, must know it
// before the recipient can run it: it is noted durably first. When the
// disk refuses the note there is no attempt (and nothing is stored: the
// send fails, and nothing ran); when the note is taken, a crash right
// after the delivery loses nothing of it, and replaying the older version
// is refused. Before, the version was noted after the delivery, without
// waiting: with the disk full at that moment and a crash before it was
// free again, the older version was replayed and ran after the newer.
func TestDirectVersionIsNotedBeforeItsAttempt(t *testing.T) {
	s := &coalesceSink{refuse: firstV1}
	c, to := s.cluster(t)
	a := func() *node.Node { return c.Node(0) }
	if out, err := a().TellReliable(ctxT(t), to, wrapperspb.String("v1"), node.WithOverwrite("config")); err != nil || out != node.DeadLettered {
		t.Fatalf("v1: %v %v, want DeadLettered", out, err)
	}
	c.DiskFull(0)
	if out, err := a().TellReliable(ctxT(t), to, wrapperspb.String("v2"), node.WithOverwrite("config")); err == nil {
		t.Fatalf("v2 with the sender's disk full: %v, want an error (its version cannot be noted, so it is neither sent nor stored)", out)
	}
	if got := s.runs(); len(got) != 0 {
		t.Fatalf("cfg ran %v while the sender's disk was full, want nothing", got)
	}
	c.FreeDisks()
	if out, err := a().TellReliable(ctxT(t), to, wrapperspb.String("v2"), node.WithOverwrite("config")); err != nil || out != node.Delivered {
		t.Fatalf("v2: %v %v, want Delivered", out, err)
	}
	if err := c.Kill(0); err != nil {
		t.Logf("kill: %v", err)
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := a().Outbox().Replay(outbox.DLQFilter{Recipient: to.String()}); n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replaying v1 after v2 was delivered: %d, %v; want 0 and ErrSuperseded", n, err)
	}
	if got := s.runs(); !slices.Equal(got, []string{"v2"}) {
		t.Fatalf("cfg ran %v, want [v2]", got)
	}
}

// coalesceSink is actor "cfg" on the second node of a two-node cluster: it
// records the versions (string values) it ran. refuse, called under its
// lock with how many times v was refused before, says whether to refuse v
// as a permanent failure (then dead-lettered by the sender); hold, when
// set, runs before a version is recorded.
type coalesceSink struct {
	mu      sync.Mutex
	ran     []string
	refused map[string]int
	refuse  func(v string, refused int) bool
	hold    func(v string)
}

// firstV1 refuses v1 the first time: it goes to the sender's dead-letter
// queue, which an operator replays later.
func firstV1(v string, refused int) bool { return v == "v1" && refused == 0 }

func (s *coalesceSink) cluster(t *testing.T) (*testnet.Cluster, node.Address) {
	t.Helper()
	c := testnet.New(t, 2, testnet.WithSpawn(func(_ int, nd *node.Node) error {
		_, err := nd.Spawn("cfg", s.handle)
		return err
	}))
	return c, c.Addr("cfg", 1)
}

func (s *coalesceSink) handle(_ context.Context, m *node.Message) (proto.Message, error) {
	var v wrapperspb.StringValue
	if err := m.Decode(&v); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.refused == nil {
		s.refused = map[string]int{}
	}
	if s.refuse(v.GetValue(), s.refused[v.GetValue()]) {
		s.refused[v.GetValue()]++
		s.mu.Unlock()
		return nil, node.Permanent(errors.New("config service not ready"))
	}
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		hold(v.GetValue())
	}
	s.mu.Lock()
	s.ran = append(s.ran, v.GetValue())
	s.mu.Unlock()
	return nil, nil
}

func (s *coalesceSink) runs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ran)
}

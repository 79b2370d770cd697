package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// kill dead-letters the head of recipient's queue with reason.
func (e *env) kill(tb testing.TB, recipient, reason string) {
	tb.Helper()
	if _, dead, err := e.Fail(recipient, e.seqs(tb, recipient)[0], outbox.Failure{Reason: reason, Permanent: true}); !dead || err != nil {
		tb.Fatalf("fail %s: %v %v", recipient, dead, err)
	}
}

func TestDLQList(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "a1")
	e.send(t, "b@n1", "b1")
	e.send(t, "c@n2", "c1")
	e.kill(t, "a@n1", "rejected: bad body")
	e.clk.Advance(time.Hour)
	e.kill(t, "b@n1", "rejected: other")
	e.kill(t, "c@n2", "expired")

	tests := []struct {
		name string
		f    outbox.DLQFilter
		want []string // recipients
	}{
		{"all", outbox.DLQFilter{}, []string{"a@n1", "b@n1", "c@n2"}},
		{"recipient", outbox.DLQFilter{Recipient: "b@n1"}, []string{"b@n1"}},
		{"node", outbox.DLQFilter{Node: "n1"}, []string{"a@n1", "b@n1"}},
		{"reason prefix", outbox.DLQFilter{Reason: "rejected"}, []string{"a@n1", "b@n1"}},
		{"older than", outbox.DLQFilter{OlderThan: 30 * time.Minute}, []string{"a@n1"}},
		{"limit", outbox.DLQFilter{Limit: 2}, []string{"a@n1", "b@n1"}},
		{"no match", outbox.DLQFilter{Node: "n9"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dl, err := e.DeadLetters(tt.f)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range dl {
				got = append(got, d.Recipient)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
	all, _ := e.DeadLetters(outbox.DLQFilter{})
	if !slices.IsSortedFunc(all, func(a, b outbox.DeadLetter) int { return compare(a.ID, b.ID) }) {
		t.Fatal("ids not increasing in arrival order")
	}
	if ids, _ := e.DeadLetters(outbox.DLQFilter{IDs: []string{all[2].ID}}); len(ids) != 1 || ids[0].Recipient != "c@n2" {
		t.Fatalf("by id %+v", ids)
	}
	if !all[0].At.Equal(epoch0) || !all[1].At.Equal(epoch0.Add(time.Hour)) {
		t.Fatalf("dead-lettered at %v and %v (wall clock)", all[0].At, all[1].At)
	}
	if st := e.Stats(); st.DLQDepth != 3 || st.DeadLettered != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestReplayAndPurgeNeedAFilter(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "a1")
	e.kill(t, "a@n1", "rejected")
	if _, err := e.Replay(outbox.DLQFilter{}); !errors.Is(err, outbox.ErrEmptyFilter) {
		t.Fatalf("replay without a filter: %v", err)
	}
	if _, err := e.Purge(outbox.DLQFilter{Limit: 5}); !errors.Is(err, outbox.ErrEmptyFilter) {
		t.Fatalf("purge with only a limit: %v", err)
	}
	if n, err := e.Purge(outbox.DLQFilter{All: true}); n != 1 || err != nil {
		t.Fatalf("purge all: %d %v", n, err)
	}
	if st := e.Stats(); st.DLQDepth != 0 {
		t.Fatalf("dlq depth %d", st.DLQDepth)
	}
}

// Replay makes a dead letter a new message: a new sequence above every
// other, attempts and errors reset, its TTL counting again from the
// replay (or ReplayTTL's).
func TestReplayStartsAfresh(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.MaxAttempts = 5 })
	woke := make(chan string, 16)
	e.SetOnEnqueue(func(r string) { woke <- r })
	old := e.withTTL(t, "a@n1", "a1", time.Minute)
	for range 2 {
		if _, _, err := e.Fail("a@n1", old, outbox.Failure{Reason: "boom", Counts: true}); err != nil {
			t.Fatal(err)
		}
	}
	e.kill(t, "a@n1", "rejected: x")
	e.clk.Advance(10 * time.Minute) // the original TTL is long gone
	later := e.send(t, "a@n1", "a2")
	drain(woke)
	if n, err := e.Replay(outbox.DLQFilter{Recipient: "a@n1"}); n != 1 || err != nil {
		t.Fatalf("replay: %d %v", n, err)
	}
	if r := <-woke; r != "a@n1" {
		t.Fatalf("relay woken for %q", r)
	}
	msgs := e.head(t, "a@n1", 10)
	if got := typesOf(msgs); !slices.Equal(got, []string{"a2", "a1"}) {
		t.Fatalf("after replay %v, want the replayed one behind", got)
	}
	m := msgs[1]
	if s := m.GetEnvelope().GetSequence(); s <= later[0] || s == old {
		t.Fatalf("replayed sequence %d, want above %d", s, later[0])
	}
	if m.GetAttempts() != 0 || m.GetLastError() != "" || m.GetDeadLetterReason() != "" || m.GetDeadLetteredUnixMs() != 0 {
		t.Fatalf("replayed message not reset: %+v", m)
	}
	if m.GetCreatedElapsedMs() != e.ElapsedMs() || m.GetEnvelope().GetTtlMs() != time.Minute.Milliseconds() {
		t.Fatalf("created %d ttl %d, want now (%d) and the original minute", m.GetCreatedElapsedMs(), m.GetEnvelope().GetTtlMs(), e.ElapsedMs())
	}
	e.clk.Advance(59 * time.Second)
	if got := e.types(t, "a@n1"); len(got) != 2 {
		t.Fatalf("replayed TTL did not restart: %v", got)
	}
	e.clk.Advance(time.Second)
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"a2"}) {
		t.Fatalf("replayed TTL did not run out a minute after the replay: %v", got)
	}

	// ReplayTTL overrides the TTL; 0 means none.
	e.kill(t, "a@n1", "rejected: y")
	if n, err := e.Replay(outbox.DLQFilter{Reason: "rejected: y"}, outbox.ReplayTTL(0)); n != 1 || err != nil {
		t.Fatalf("replay with no TTL: %d %v", n, err)
	}
	if m := e.head(t, "a@n1", 1)[0]; m.GetEnvelope().GetTtlMs() != 0 {
		t.Fatalf("ttl %d, want none", m.GetEnvelope().GetTtlMs())
	}
	e.kill(t, "a@n1", "rejected: z")
	if n, err := e.Replay(outbox.DLQFilter{Reason: "rejected: z"}, outbox.ReplayTTL(5*time.Minute)); n != 1 || err != nil {
		t.Fatalf("replay with a TTL: %d %v", n, err)
	}
	if m := e.head(t, "a@n1", 1)[0]; m.GetEnvelope().GetTtlMs() != (5 * time.Minute).Milliseconds() {
		t.Fatalf("ttl %d, want 5 min", m.GetEnvelope().GetTtlMs())
	}
	e.kill(t, "a@n1", "rejected: w")
	if _, err := e.Replay(outbox.DLQFilter{All: true}, outbox.ReplayTTL(e.Config().MaxAge()+time.Second)); !errors.Is(err, outbox.ErrBadMessage) {
		t.Fatalf("replay TTL over MaxAge: %v", err)
	}
}

func drain(c chan string) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// An OVERWRITE dead letter whose coalesce key has a newer version (queued
// or already delivered) stays in the DLQ: replaying it would run an older
// version after a newer one.
func TestReplayRefusesSupersededOverwrite(t *testing.T) {
	e := open(t, nil)
	ow := func(typ string) *pb.StoredMessage {
		sm := e.msg(t, "a@n1", typ)
		sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "k"
		return sm
	}
	e.put(t, ow("v1"))
	e.kill(t, "a@n1", "rejected: v1")
	v2 := ow("v2")
	e.put(t, v2)
	n, err := e.Replay(outbox.DLQFilter{Recipient: "a@n1"})
	if n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replay of a superseded version: %d %v", n, err)
	}
	if err := e.Ack("a@n1", []uint64{v2.GetEnvelope().GetSequence()}); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Replay(outbox.DLQFilter{Recipient: "a@n1"}); n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replay after the newer version was delivered: %d %v", n, err)
	}
	if dl, _ := e.DeadLetters(outbox.DLQFilter{}); len(dl) != 1 {
		t.Fatalf("superseded dead letter not left in place: %d", len(dl))
	}
	// The newest version itself replays, and a mixed replay reports only
	// what it did.
	v3 := ow("v3")
	e.put(t, v3)
	e.kill(t, "a@n1", "rejected: v3")
	if n, err := e.Replay(outbox.DLQFilter{Recipient: "a@n1"}); n != 1 || err != nil {
		t.Fatalf("replay of the newest version: %d %v", n, err)
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"v3"}) {
		t.Fatalf("queue %v", got)
	}
}

// seqr is a Sequencer that records what Replay asks for.
type seqr struct {
	s *outbox.Store
	// mu guards the fields below.
	mu       sync.Mutex
	reserved []string
	done     int
}

func (q *seqr) Reserve(r string) (uint64, func(), error) {
	seq, err := q.s.ReserveSequence()
	q.mu.Lock()
	q.reserved = append(q.reserved, r)
	q.mu.Unlock()
	return seq, func() { q.mu.Lock(); q.done++; q.mu.Unlock() }, err
}

// Replay takes its sequences from the installed Sequencer (the relay), and
// tells it when each commit has ended.
func TestReplayUsesSequencer(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "a1")
	e.send(t, "b@n2", "b1")
	e.kill(t, "a@n1", "rejected")
	e.kill(t, "b@n2", "rejected")
	q := &seqr{s: e.Store}
	e.SetSequencer(q)
	if n, err := e.Replay(outbox.DLQFilter{All: true}); n != 2 || err != nil {
		t.Fatalf("replay: %d %v", n, err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !slices.Equal(q.reserved, []string{"a@n1", "b@n2"}) || q.done != 2 {
		t.Fatalf("sequencer saw %v and %d dones", q.reserved, q.done)
	}
	e.SetSequencer(nil) // back to ReserveSequence
	e.kill(t, "a@n1", "rejected")
	if n, err := e.Replay(outbox.DLQFilter{All: true}); n != 1 || err != nil {
		t.Fatalf("replay without a sequencer: %d %v", n, err)
	}
}

// Replay and Purge work in pages of a few hundred records, each its own
// transaction: other writers are not held up for the whole of a big
// replay. Enqueues running meanwhile complete before it ends.
func TestReplayInPagesLetsOthersCommit(t *testing.T) {
	e := open(t, nil)
	const n = 3000
	msgs := make([]*pb.StoredMessage, n)
	for i := range msgs {
		msgs[i] = e.msg(t, fmt.Sprintf("a%d@n1", i%10), fmt.Sprint(i))
	}
	if _, errs := e.EnqueueBatch(context.Background(), msgs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	if got, err := e.DropQueue("n1", "test"); got != n || err != nil {
		t.Fatalf("drop: %d %v", got, err)
	}
	for _, op := range []struct {
		name string
		run  func() (int, error)
	}{
		{"replay", func() (int, error) { return e.Replay(outbox.DLQFilter{Node: "n1"}) }},
		{"purge", func() (int, error) {
			if _, err := e.DropQueue("n1", "again"); err != nil {
				return 0, err
			}
			return e.Purge(outbox.DLQFilter{Node: "n1"})
		}},
	} {
		t.Run(op.name, func(t *testing.T) {
			var running atomic.Bool
			var during atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					sm := e.msg(t, "other@n2", fmt.Sprint(i))
					if _, err := e.Enqueue(context.Background(), sm); err != nil {
						t.Error(err)
						return
					}
					if running.Load() {
						during.Add(1)
					}
				}
			}()
			before := e.Stats().Fsyncs
			running.Store(true)
			got, err := op.run()
			running.Store(false)
			close(stop)
			wg.Wait()
			if err != nil || got != n {
				t.Fatalf("%s: %d %v", op.name, got, err)
			}
			if commits := e.Stats().Fsyncs - before; commits < n/256 {
				t.Fatalf("%d dead letters in %d commits, want pages of at most 256", n, commits)
			}
			// One transaction would let at most the enqueue already queued
			// with it through; pages let one through per page or so.
			if during.Load() < 4 {
				t.Fatalf("%d enqueues completed during the %s of %d dead letters, want several", during.Load(), op.name, n)
			}
			t.Logf("%d enqueues completed during the %s", during.Load(), op.name)
		})
	}
	if st := e.Stats(); st.DLQDepth != 0 || st.DepthByPeer["n1"] != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPurgeLimitAndIDs(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", names("a", 5)...)
	for range 5 {
		e.kill(t, "a@n1", "rejected")
	}
	all, _ := e.DeadLetters(outbox.DLQFilter{})
	if n, err := e.Purge(outbox.DLQFilter{IDs: []string{all[1].ID, all[3].ID}}); n != 2 || err != nil {
		t.Fatalf("purge by id: %d %v", n, err)
	}
	if n, err := e.Purge(outbox.DLQFilter{All: true, Limit: 2}); n != 2 || err != nil {
		t.Fatalf("purge with limit: %d %v", n, err)
	}
	left, _ := e.DeadLetters(outbox.DLQFilter{})
	if len(left) != 1 || left[0].ID != all[4].ID {
		t.Fatalf("left %+v", left)
	}
}

func TestDeadLetterDirect(t *testing.T) {
	e := open(t, nil)
	sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", MsgId: "p1", Sequence: 5}}
	if err := e.DeadLetter(context.Background(), sm, "rejected: bad input"); err != nil {
		t.Fatal(err)
	}
	dl, err := e.DeadLetters(outbox.DLQFilter{Recipient: "a@n1"})
	if err != nil || len(dl) != 1 || dl[0].Reason != "rejected: bad input" || dl[0].Message.GetEnvelope().GetMsgId() != "p1" {
		t.Fatalf("dead letters = %+v, %v", dl, err)
	}
	if st := e.Stats(); st.Depth != 0 || st.DLQDepth != 1 || st.DeadLettered != 1 {
		t.Fatalf("stats %+v: want depth 0, one dead letter", st)
	}
	bad := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "nobody"}}
	if err := e.DeadLetter(context.Background(), bad, "x"); !errors.Is(err, outbox.ErrBadRecipient) {
		t.Fatalf("bad recipient = %v", err)
	}
	if err := e.DeadLetter(context.Background(), &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1"}}, outbox.ReasonExpired); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Expired != 1 {
		t.Fatalf("an expired dead letter is not counted as expired: %+v", st)
	}
}

// A dead letter that cannot be encoded fails alone: the operations that
// share its commit still commit.
func TestUnencodableDeadLetterFailsAlone(t *testing.T) {
	e := open(t, nil)
	good := e.msg(t, "a@n1", "good")
	release := stall(t, e.Store)
	errs := make(chan error, 2)
	go func() {
		bad := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "bad\xff"}}
		errs <- e.DeadLetter(context.Background(), bad, "rejected: poison")
	}()
	go func() {
		_, err := e.Enqueue(context.Background(), good)
		errs <- err
	}()
	waitQueued(t, e.Store, 2) // both in the next commit
	release()
	var failed int
	for range 2 {
		if err := <-errs; err != nil {
			if !errors.Is(err, outbox.ErrBadMessage) {
				t.Fatalf("error %v, want ErrBadMessage for the bad dead letter only", err)
			}
			failed++
		}
	}
	if failed != 1 || e.Pending("a@n1") != 1 {
		t.Fatalf("%d failed, %d queued: the good message shared the bad one's fate", failed, e.Pending("a@n1"))
	}
}

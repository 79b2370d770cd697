package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*outbox.Config)
		ok   bool
	}{
		{"default", func(*outbox.Config) {}, true},
		{"no path", func(c *outbox.Config) { c.Path = "" }, false},
		{"no lock timeout", func(c *outbox.Config) { c.LockTimeout = 0 }, false},
		{"zero attempts", func(c *outbox.Config) { c.MaxAttempts = 0 }, false},
		{"cap below base", func(c *outbox.Config) { c.Backoff.Cap = time.Millisecond }, false},
		{"limiter min 0", func(c *outbox.Config) { c.Limiter.Min = 0 }, false},
		{"limiter initial over max", func(c *outbox.Config) { c.Limiter.Initial = 1000 }, false},
		{"no window", func(c *outbox.Config) { c.DedupeWindow = 0 }, false},
		{"no batch", func(c *outbox.Config) { c.MaxBatch = 0 }, false},
		{"no queue", func(c *outbox.Config) { c.QueueSize = 0 }, false},
		{"negative linger", func(c *outbox.Config) { c.CommitLinger = -time.Microsecond }, false},
		{"huge linger", func(c *outbox.Config) { c.CommitLinger = time.Hour }, false},
		{"no linger", func(c *outbox.Config) { c.CommitLinger = 0 }, true},
		{"no clock", func(c *outbox.Config) { c.Now = nil }, false},
		{"no logger", func(c *outbox.Config) { c.Logger = nil }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := outbox.DefaultConfig("x.db")
			tt.mut(&c)
			err := c.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, outbox.ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			if !tt.ok {
				if _, err := outbox.Open(c); err == nil {
					t.Fatal("Open accepted an invalid config")
				}
			}
		})
	}
}

func TestEnqueueRejectsBadInput(t *testing.T) {
	clk := newClock()
	s, _ := openTemp(t, func(c *outbox.Config) { c.Now = clk.Now })
	tests := []struct {
		name string
		env  *pb.Envelope
		want error
	}{
		{"nil", nil, outbox.ErrNoRecipient},
		{"empty recipient", &pb.Envelope{}, outbox.ErrNoRecipient},
		{"no node", &pb.Envelope{Recipient: "a@"}, outbox.ErrBadRecipient},
		{"no actor", &pb.Envelope{Recipient: "@n1"}, outbox.ErrBadRecipient},
		{"no at", &pb.Envelope{Recipient: "actor"}, outbox.ErrBadRecipient},
		{"expired", &pb.Envelope{Recipient: "a@n1", ExpiresAtUnixMs: clk.Now().UnixMilli() - 1}, outbox.ErrExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := s.Enqueue(context.Background(), tt.env); !errors.Is(err, tt.want) {
				t.Fatalf("Enqueue = %v, want %v", err, tt.want)
			}
		})
	}
	if st := s.Stats(); st.Depth != 0 || st.Expired != 1 {
		t.Fatalf("depth %d expired %d, want 0 and 1", st.Depth, st.Expired)
	}
}

func TestFIFOAndRule1(t *testing.T) {
	s, _ := openTemp(t, nil)
	enqueue(t, s, mkEnv("a@n1", "m1"), mkEnv("a@n1", "m2"))
	// A caller-chosen sequence lower than the waiting ones still goes
	// behind them (rule 1).
	low := mkEnv("a@n1", "m3")
	low.Sequence = 1
	enqueue(t, s, low)
	if got := types(t, s, "a@n1", 10); !slices.Equal(got, []string{"m1", "m2", "m3"}) {
		t.Fatalf("order %v", got)
	}
	if low.Sequence == 1 {
		t.Fatal("low sequence was not re-sequenced behind the tail")
	}
	if s.Pending("a@n1") != 3 || s.Pending("b@n1") != 0 {
		t.Fatalf("pending %d / %d", s.Pending("a@n1"), s.Pending("b@n1"))
	}
	sq := seqs(t, s, "a@n1", 10)
	if err := s.Ack("a@n1", sq[:2]); err != nil {
		t.Fatal(err)
	}
	if got := types(t, s, "a@n1", 10); !slices.Equal(got, []string{"m3"}) {
		t.Fatalf("after ack %v", got)
	}
	if err := s.Ack("a@n1", sq[2:]); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Depth != 0 || st.Delivered != 3 || st.Enqueued != 3 {
		t.Fatalf("stats %+v", st)
	}
	due, _ := s.DueRecipients(time.Now(), nil, 10)
	if len(due) != 0 {
		t.Fatalf("empty queue still due: %v", due)
	}
}

func TestSecondOpenIsLocked(t *testing.T) {
	_, path := openTemp(t, nil)
	cfg := outbox.DefaultConfig(path)
	cfg.LockTimeout = 100 * time.Millisecond
	start := time.Now()
	s2, err := outbox.Open(cfg)
	if err == nil {
		_ = s2.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
	if !errors.Is(err, outbox.ErrLocked) {
		t.Fatalf("err = %v, want ErrLocked", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("ErrLocked after %v, want about the 100ms timeout", el)
	}
}

func TestClosed(t *testing.T) {
	s, _ := openTemp(t, nil)
	enqueue(t, s, mkEnv("a@n1", "m1"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	checks := map[string]error{
		"close":   s.Close(),
		"enqueue": s.Enqueue(ctx, mkEnv("a@n1", "m2")),
		"ack":     s.Ack("a@n1", []uint64{1}),
		"record":  s.Record(ctx, "x", "k"),
	}
	_, checks["head"] = s.Head("a@n1", 1)
	_, checks["fail"] = s.Fail("a@n1", 1, outbox.Failure{Counts: true})
	_, checks["replay"] = s.Replay(outbox.DLQFilter{All: true})
	_, checks["list"] = s.DeadLetters(outbox.DLQFilter{})
	for name, err := range checks {
		if !errors.Is(err, outbox.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
}

func TestGroupCommit(t *testing.T) {
	s, _ := openTemp(t, nil)
	const callers, each = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := s.Enqueue(context.Background(), mkEnv(fmt.Sprintf("a%d@n1", c%8), fmt.Sprint(i))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Depth != callers*each {
		t.Fatalf("depth %d, want %d", st.Depth, callers*each)
	}
	if st.Fsyncs*4 > uint64(callers*each) {
		t.Fatalf("%d fsyncs for %d messages: group commit is not batching", st.Fsyncs, callers*each)
	}
	t.Logf("%d messages in %d commits", callers*each, st.Fsyncs)
}

func TestEnqueueBatch(t *testing.T) {
	s, _ := openTemp(t, nil)
	envs := []*pb.Envelope{mkEnv("a@n1", "1"), nil, mkEnv("b@n2", "2"), {Recipient: "bad"}, mkEnv("c@n3", "3")}
	before := s.Stats().Fsyncs
	errs := s.EnqueueBatch(context.Background(), envs)
	want := []error{nil, outbox.ErrNoRecipient, nil, outbox.ErrBadRecipient, nil}
	for i := range want {
		if (want[i] == nil && errs[i] != nil) || (want[i] != nil && !errors.Is(errs[i], want[i])) {
			t.Fatalf("errs[%d] = %v, want %v", i, errs[i], want[i])
		}
	}
	if st := s.Stats(); st.Depth != 3 || st.Fsyncs-before != 1 {
		t.Fatalf("depth %d in %d commits, want 3 in 1", st.Depth, st.Fsyncs-before)
	}
}

func TestOverwriteRule7(t *testing.T) {
	s, _ := openTemp(t, nil)
	ctx := context.Background()
	ow := func(body string, seq uint64) *pb.Envelope {
		e := mkEnv("hb@n1", body)
		e.IdempotencyKey, e.Conflict, e.Sequence = "heartbeat", pb.Envelope_OVERWRITE, seq
		return e
	}
	enqueue(t, s, mkEnv("hb@n1", "plain"))
	base := s.NextSequence()
	steps := []struct {
		env  *pb.Envelope
		want outbox.Result
	}{
		{ow("v1", base+10), outbox.Queued},
		{ow("v2", base+20), outbox.Replaced},   // newer replaces
		{ow("v0", base+15), outbox.Superseded}, // older never replaces newer
		{ow("v2dup", base+20), outbox.Superseded},
	}
	for _, st := range steps {
		res, err := s.EnqueueResult(ctx, st.env)
		if err != nil || res != st.want {
			t.Fatalf("%s: %v, %v; want %v", st.env.GetType(), res, err, st.want)
		}
	}
	enqueue(t, s, mkEnv("hb@n1", "after"))
	if got := types(t, s, "hb@n1", 10); !slices.Equal(got, []string{"plain", "v2", "after"}) {
		t.Fatalf("queue %v", got)
	}
	// After v2 is delivered, an older overwrite is still superseded.
	msgs, _ := s.Head("hb@n1", 10)
	if err := s.Ack("hb@n1", []uint64{msgs[1].GetEnvelope().GetSequence()}); err != nil {
		t.Fatal(err)
	}
	if res, _ := s.EnqueueResult(ctx, ow("late", base+11)); res != outbox.Superseded {
		t.Fatalf("late older overwrite = %v", res)
	}
	// A newer one appends at the tail.
	if res, _ := s.EnqueueResult(ctx, ow("v3", 0)); res != outbox.Queued {
		t.Fatalf("v3 = %v", res)
	}
	if got := types(t, s, "hb@n1", 10); !slices.Equal(got, []string{"plain", "after", "v3"}) {
		t.Fatalf("queue %v", got)
	}
	st := s.Stats()
	if st.Coalesced != 1 || st.Superseded != 3 {
		t.Fatalf("coalesced %d superseded %d", st.Coalesced, st.Superseded)
	}
}

func TestExpiredRule8(t *testing.T) {
	clk := newClock()
	s, _ := openTemp(t, func(c *outbox.Config) { c.Now = clk.Now })
	ttl := func(body string, d time.Duration) *pb.Envelope {
		e := mkEnv("a@n1", body)
		e.ExpiresAtUnixMs = clk.Now().Add(d).UnixMilli()
		return e
	}
	enqueue(t, s, ttl("short1", time.Second), ttl("long", time.Hour), ttl("short2", time.Second), mkEnv("a@n1", "forever"))
	clk.Advance(2 * time.Second)
	if got := types(t, s, "a@n1", 10); !slices.Equal(got, []string{"long", "forever"}) {
		t.Fatalf("head %v: expired messages returned", got)
	}
	dl, err := s.DeadLetters(outbox.DLQFilter{Reason: "expired"})
	if err != nil || len(dl) != 2 {
		t.Fatalf("dead letters %v, %v", dl, err)
	}
	for _, d := range dl {
		if d.Reason != "expired" || d.Recipient != "a@n1" || d.Message.GetEnvelope().GetType()[:5] != "short" {
			t.Fatalf("dead letter %+v", d)
		}
	}
	if st := s.Stats(); st.Expired != 2 || st.DLQDepth != 2 || st.Depth != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFailAndMaxAttempts(t *testing.T) {
	clk := newClock()
	s, _ := openTemp(t, func(c *outbox.Config) { c.Now = clk.Now; c.MaxAttempts = 3 })
	enqueue(t, s, mkEnv("a@n1", "poison"), mkEnv("a@n1", "next"))
	seq := seqs(t, s, "a@n1", 1)[0]

	// Uncounted failures (peer down, capacity) never dead-letter (rule 3).
	for range 10 {
		dead, err := s.Fail("a@n1", seq, outbox.Failure{Reason: "capacity", RetryAfter: time.Second})
		if err != nil || dead {
			t.Fatalf("uncounted fail: dead=%v err=%v", dead, err)
		}
	}
	due, next := s.DueRecipients(clk.Now(), nil, 10)
	if len(due) != 0 || !next.Equal(clk.Now().Add(time.Second)) {
		t.Fatalf("after RetryAfter: due %v next %v", due, next)
	}
	for i := 1; i <= 3; i++ {
		dead, err := s.Fail("a@n1", seq, outbox.Failure{Reason: "handler: boom", Counts: true})
		if err != nil {
			t.Fatal(err)
		}
		if dead != (i == 3) {
			t.Fatalf("attempt %d dead=%v", i, dead)
		}
		if i < 3 {
			msgs, _ := s.Head("a@n1", 1)
			if msgs[0].GetAttempts() != uint32(i) || msgs[0].GetLastError() != "handler: boom" {
				t.Fatalf("attempt %d stored %+v", i, msgs[0])
			}
		}
	}
	if got := types(t, s, "a@n1", 10); !slices.Equal(got, []string{"next"}) {
		t.Fatalf("after dead-letter %v", got)
	}
	dl, _ := s.DeadLetters(outbox.DLQFilter{Recipient: "a@n1"})
	if len(dl) != 1 || dl[0].Reason != "max attempts" || dl[0].Message.GetAttempts() != 3 {
		t.Fatalf("dlq %+v", dl)
	}
	// Permanent goes straight to the DLQ.
	seq = seqs(t, s, "a@n1", 1)[0]
	if dead, _ := s.Fail("a@n1", seq, outbox.Failure{Reason: "rejected: bad body", Permanent: true}); !dead {
		t.Fatal("permanent failure not dead-lettered")
	}
	// Unknown sequence is ignored.
	if dead, err := s.Fail("a@n1", 12345, outbox.Failure{Counts: true}); dead || err != nil {
		t.Fatalf("unknown seq: %v %v", dead, err)
	}
	if st := s.Stats(); st.DeadLettered != 2 || st.Retries != 12 || st.Depth != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDueDeferWake(t *testing.T) {
	clk := newClock()
	s, _ := openTemp(t, func(c *outbox.Config) { c.Now = clk.Now })
	enqueue(t, s, mkEnv("a@n1", "1"), mkEnv("b@n1", "2"), mkEnv("c@n2", "3"))
	now := clk.Now()
	due, _ := s.DueRecipients(now, nil, 10)
	slices.Sort(due)
	if !slices.Equal(due, []string{"a@n1", "b@n1", "c@n2"}) {
		t.Fatalf("due %v", due)
	}
	due, next := s.DueRecipients(now, nil, 2)
	if len(due) != 2 || !next.Equal(now) {
		t.Fatalf("limit: due %v next %v", due, next)
	}
	due, _ = s.DueRecipients(now, func(r string) bool { return r == "c@n2" }, 10)
	if !slices.Equal(due, []string{"c@n2"}) {
		t.Fatalf("keep filter: %v", due)
	}
	s.Defer("a@n1", now.Add(time.Hour))
	s.Defer("b@n1", now.Add(time.Minute))
	s.Defer("nobody@n9", now.Add(time.Minute)) // no queue: ignored
	due, next = s.DueRecipients(now, nil, 10)
	if !slices.Equal(due, []string{"c@n2"}) || !next.Equal(now.Add(time.Minute)) {
		t.Fatalf("after defer: due %v next %v", due, next)
	}
	s.WakeNode("n1")
	due, _ = s.DueRecipients(clk.Now(), nil, 10)
	if len(due) != 3 {
		t.Fatalf("after WakeNode: %v", due)
	}
	// A new enqueue does not cancel a deferral.
	s.Defer("a@n1", now.Add(time.Hour))
	enqueue(t, s, mkEnv("a@n1", "4"))
	due, _ = s.DueRecipients(clk.Now(), func(r string) bool { return r == "a@n1" }, 10)
	if len(due) != 0 {
		t.Fatalf("enqueue made a deferred recipient due: %v", due)
	}
}

func TestRestartKeepsEverything(t *testing.T) {
	clk := newClock()
	mut := func(c *outbox.Config) { c.Now = clk.Now }
	s, path := openTemp(t, mut)
	enqueue(t, s, mkEnv("a@n1", "1"), mkEnv("a@n1", "2"), mkEnv("b@n2", "3"), mkEnv("a@n1", "4"))
	// Rule 5: a message handed out by Head but never acked is redelivered.
	handed := seqs(t, s, "a@n1", 2)
	if dead, err := s.Fail("b@n2", seqs(t, s, "b@n2", 1)[0], outbox.Failure{Reason: "rejected", Permanent: true}); !dead || err != nil {
		t.Fatalf("permanent fail: %v %v", dead, err)
	}
	if err := s.Record(context.Background(), "app@n0", "k1"); err != nil {
		t.Fatal(err)
	}
	lastSeq := s.NextSequence()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := openAt(t, path, mut)
	defer s2.Close()
	if got := types(t, s2, "a@n1", 10); !slices.Equal(got, []string{"1", "2", "4"}) {
		t.Fatalf("queue after restart %v", got)
	}
	if got := seqs(t, s2, "a@n1", 2); !slices.Equal(got, handed) {
		t.Fatalf("redelivered seqs %v, want %v", got, handed)
	}
	if s2.Pending("a@n1") != 3 || s2.Pending("b@n2") != 0 {
		t.Fatalf("pending %d %d", s2.Pending("a@n1"), s2.Pending("b@n2"))
	}
	if dl, _ := s2.DeadLetters(outbox.DLQFilter{}); len(dl) != 1 || dl[0].Recipient != "b@n2" {
		t.Fatalf("dlq after restart %+v", dl)
	}
	if !s2.Seen("app@n0", "k1") || s2.Seen("app@n0", "k2") {
		t.Fatal("dedupe keys not kept across restart")
	}
	if n := s2.NextSequence(); n <= lastSeq {
		t.Fatalf("sequence went backwards: %d after %d", n, lastSeq)
	}
	st := s2.Stats()
	if st.Depth != 3 || st.DLQDepth != 1 || st.DepthByPeer["n1"] != 3 {
		t.Fatalf("stats after restart %+v", st)
	}
}

// A key bbolt would refuse must fail alone, never the group commit it
// would have shared with other callers.
func TestOversizedKeyRefusedAlone(t *testing.T) {
	s, _ := openTemp(t, nil)
	big := strings.Repeat("k", outbox.MaxKeyLen+1)
	envs := []*pb.Envelope{
		{Recipient: "a@n1", MsgId: "ok"},
		{Recipient: "a@n1", MsgId: "big", IdempotencyKey: big, Conflict: pb.Envelope_OVERWRITE},
	}
	errs := s.EnqueueBatch(context.Background(), envs)
	if errs[0] != nil || !errors.Is(errs[1], outbox.ErrBadKey) {
		t.Fatalf("EnqueueBatch errors = %v, want [nil ErrBadKey]", errs)
	}
	if err := s.Record(context.Background(), "p", big); !errors.Is(err, outbox.ErrBadKey) {
		t.Fatalf("Record(big) = %v, want ErrBadKey", err)
	}
	done := make(chan error, 1)
	s.RecordAsync("p", big, func(err error) { done <- err })
	if err := <-done; !errors.Is(err, outbox.ErrBadKey) {
		t.Fatalf("RecordAsync(big) = %v, want ErrBadKey", err)
	}
	if got := s.Pending("a@n1"); got != 1 {
		t.Fatalf("Pending = %d, want 1 (the normal message was stored)", got)
	}
}

func TestDeadLetterDirect(t *testing.T) {
	s, _ := openTemp(t, nil)
	env := &pb.Envelope{Recipient: "a@n1", MsgId: "p1", IdempotencyKey: "k"}
	if err := s.DeadLetter(context.Background(), env, "rejected: bad input"); err != nil {
		t.Fatal(err)
	}
	dl, err := s.DeadLetters(outbox.DLQFilter{Recipient: "a@n1"})
	if err != nil || len(dl) != 1 || dl[0].Reason != "rejected: bad input" || dl[0].Message.GetEnvelope().GetMsgId() != "p1" {
		t.Fatalf("dead letters = %+v, %v", dl, err)
	}
	if st := s.Stats(); st.Depth != 0 || st.DLQDepth != 1 || st.DeadLettered != 1 {
		t.Fatalf("stats %+v: want depth 0, one dead letter", st)
	}
	if err := s.DeadLetter(context.Background(), &pb.Envelope{Recipient: "nobody"}, "x"); !errors.Is(err, outbox.ErrBadRecipient) {
		t.Fatalf("bad recipient = %v", err)
	}
}

package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshnode/meshnode/internal/testutil"
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
		{"no key window", func(c *outbox.Config) { c.KeyWindow = 0 }, false},
		{"no retention", func(c *outbox.Config) { c.StreamRetention = 0 }, false},
		{"margin not below retention", func(c *outbox.Config) { c.RetentionMargin = c.StreamRetention }, false},
		{"no margin", func(c *outbox.Config) { c.RetentionMargin = 0 }, false},
		{"negative skew", func(c *outbox.Config) { c.MaxClockSkew = -1 }, false},
		{"zero skew", func(c *outbox.Config) { c.MaxClockSkew = 0 }, true},
		{"negative downtime", func(c *outbox.Config) { c.MaxDowntime = -1 }, false},
		{"no checkpoint interval", func(c *outbox.Config) { c.CheckpointInterval = 0 }, false},
		{"no batch", func(c *outbox.Config) { c.MaxBatch = 0 }, false},
		{"no batch bytes", func(c *outbox.Config) { c.MaxBatchBytes = 0 }, false},
		{"no queue", func(c *outbox.Config) { c.QueueSize = 0 }, false},
		{"negative linger", func(c *outbox.Config) { c.CommitLinger = -time.Microsecond }, false},
		{"huge linger", func(c *outbox.Config) { c.CommitLinger = time.Hour }, false},
		{"no linger", func(c *outbox.Config) { c.CommitLinger = 0 }, true},
		{"no sequence block", func(c *outbox.Config) { c.SequenceBlock = 0 }, false},
		{"largest sequence block", func(c *outbox.Config) { c.SequenceBlock = 1 << 32 }, true},
		{"sequence block that wraps the sequence record in a few starts", func(c *outbox.Config) { c.SequenceBlock = 1 << 61 }, false},
		{"no clock", func(c *outbox.Config) { c.Clock = nil }, false},
		{"no logger", func(c *outbox.Config) { c.Logger = nil }, true}, // nil discards
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := outbox.DefaultConfig(filepath.Join(t.TempDir(), "x.db"))
			tt.mut(&c)
			err := c.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, outbox.ErrBadConfig) {
				t.Fatalf("error %v does not wrap ErrBadConfig", err)
			}
			if !tt.ok {
				s, oerr := outbox.Open(c)
				if oerr == nil {
					_ = s.Close()
					t.Fatal("Open accepted an invalid config")
				}
				if oerr.Error() != err.Error() {
					t.Fatalf("Open says %q, want Validate's %q (read once)", oerr, err)
				}
			}
			if tt.ok && c.Logger == nil { // nil discards: the store opens
				s, err := outbox.Open(c)
				if err != nil {
					t.Fatalf("Open with a nil logger: %v", err)
				}
				_ = s.Close()
			}
		})
	}
	if got := outbox.DefaultConfig("x").MaxAge(); got != 23*24*time.Hour {
		t.Fatalf("default MaxAge = %v, want 23 days", got)
	}
}

func TestEnqueueRejectsBadInput(t *testing.T) {
	e := open(t, nil)
	e.clk.Advance(time.Hour) // so that "created an hour ago" is a valid elapsed time
	maxAge := e.Config().MaxAge().Milliseconds()
	mk := func(edit func(*pb.StoredMessage)) *pb.StoredMessage {
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: 7}}
		edit(sm)
		return sm
	}
	tests := []struct {
		name string
		sm   *pb.StoredMessage
		want error
	}{
		{"nil", nil, outbox.ErrNoRecipient},
		{"no envelope", &pb.StoredMessage{}, outbox.ErrNoRecipient},
		{"empty recipient", mk(func(sm *pb.StoredMessage) { sm.Envelope.Recipient = "" }), outbox.ErrNoRecipient},
		{"no node", mk(func(sm *pb.StoredMessage) { sm.Envelope.Recipient = "a@" }), outbox.ErrBadRecipient},
		{"no actor", mk(func(sm *pb.StoredMessage) { sm.Envelope.Recipient = "@n1" }), outbox.ErrBadRecipient},
		{"no at", mk(func(sm *pb.StoredMessage) { sm.Envelope.Recipient = "actor" }), outbox.ErrBadRecipient},
		{"NUL", mk(func(sm *pb.StoredMessage) { sm.Envelope.Recipient = "a\x00b@n1" }), outbox.ErrBadRecipient},
		{"too long", mk(func(sm *pb.StoredMessage) { sm.Envelope.Recipient = strings.Repeat("a", 1100) + "@n1" }), outbox.ErrBadRecipient},
		{"no sequence", mk(func(sm *pb.StoredMessage) { sm.Envelope.Sequence = 0 }), outbox.ErrBadMessage},
		{"long idempotency key", mk(func(sm *pb.StoredMessage) { sm.Envelope.IdempotencyKey = strings.Repeat("k", outbox.MaxKeyLen+1) }), outbox.ErrBadMessage},
		{"long coalesce key", mk(func(sm *pb.StoredMessage) { sm.Envelope.CoalesceKey = strings.Repeat("k", outbox.MaxKeyLen+1) }), outbox.ErrBadMessage},
		{"negative TTL", mk(func(sm *pb.StoredMessage) { sm.Envelope.TtlMs = -1 }), outbox.ErrBadMessage},
		{"TTL over MaxAge", mk(func(sm *pb.StoredMessage) { sm.Envelope.TtlMs = maxAge + 1 }), outbox.ErrBadMessage},
		{"already expired", mk(func(sm *pb.StoredMessage) {
			sm.Envelope.TtlMs = time.Minute.Milliseconds()
			sm.CreatedElapsedMs = e.ElapsedMs() - time.Minute.Milliseconds()
		}), outbox.ErrExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := e.Enqueue(context.Background(), tt.sm); !errors.Is(err, tt.want) {
				t.Fatalf("Enqueue = %v, want %v", err, tt.want)
			}
		})
	}
	if st := e.Stats(); st.Depth != 0 || st.Expired != 1 || st.Fsyncs != 0 {
		t.Fatalf("depth %d expired %d fsyncs %d, want 0, 1, 0 (refused before the committer)", st.Depth, st.Expired, st.Fsyncs)
	}
	// A sequence already queued is refused: it would overwrite a message.
	sm := e.msg(t, "a@n1", "first")
	e.put(t, sm)
	dup := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: sm.GetEnvelope().GetSequence(), Type: "second"}}
	if _, err := e.Enqueue(context.Background(), dup); !errors.Is(err, outbox.ErrBadMessage) {
		t.Fatalf("duplicate sequence: %v, want ErrBadMessage", err)
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("queue %v after a duplicate sequence", got)
	}
}

// A message is stored at its envelope's sequence and never renumbered;
// the queue is ordered by sequence even when a lower sequence is stored
// after a higher one (two senders of one stream racing to the committer).
func TestQueueOrderedBySequence(t *testing.T) {
	e := open(t, nil)
	var seqs []uint64
	for range 3 {
		s, err := e.ReserveSequence()
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	if !slices.IsSorted(seqs) || seqs[0] == 0 || seqs[0] == seqs[1] {
		t.Fatalf("reserved %v, want increasing and > 0", seqs)
	}
	for _, i := range []int{2, 0, 1} { // highest first
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: seqs[i], Type: fmt.Sprint("m", i)}}
		if res := e.put(t, sm); res != outbox.Queued {
			t.Fatalf("result %v", res)
		}
		if sm.GetEnvelope().GetSequence() != seqs[i] {
			t.Fatalf("sequence renumbered from %d to %d", seqs[i], sm.GetEnvelope().GetSequence())
		}
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"m0", "m1", "m2"}) {
		t.Fatalf("order %v, want by sequence", got)
	}
	if got := e.seqs(t, "a@n1"); !slices.Equal(got, seqs) {
		t.Fatalf("sequences %v, want %v", got, seqs)
	}
	if e.Pending("a@n1") != 3 || e.Pending("b@n1") != 0 {
		t.Fatalf("pending %d / %d", e.Pending("a@n1"), e.Pending("b@n1"))
	}
	if err := e.Ack("a@n1", seqs[:2]); err != nil {
		t.Fatal(err)
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"m2"}) {
		t.Fatalf("after ack %v", got)
	}
	if err := e.Ack("a@n1", append(seqs, 999999)); err != nil { // acked twice and unknown: ignored
		t.Fatal(err)
	}
	if st := e.Stats(); st.Depth != 0 || st.Delivered != 3 || st.Enqueued != 3 {
		t.Fatalf("stats %+v", st)
	}
	if due, _ := e.DueRecipients(e.ElapsedMs(), nil, 10); len(due) != 0 {
		t.Fatalf("empty queue still due: %v", due)
	}
}

// TestHeadMaxBytes: a head of large messages stops before the one that
// would take its stored bytes over MaxBytes.
func TestHeadMaxBytes(t *testing.T) {
	e := open(t, nil)
	big := strings.Repeat("x", 1000)
	s := e.send(t, "a@n1", big+"0", big+"1", big+"2", big+"3")
	for _, tt := range []struct {
		maxBytes int
		want     []uint64
	}{{0, s}, {2500, s[:2]}, {3500, s[:3]}, {1 << 20, s}} {
		msgs, _, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 10, MaxBytes: tt.maxBytes})
		if err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for _, m := range msgs {
			got = append(got, m.GetEnvelope().GetSequence())
		}
		if !slices.Equal(got, tt.want) {
			t.Fatalf("MaxBytes %d: got %v, want %v", tt.maxBytes, got, tt.want)
		}
	}
}

func TestHeadSkipAndBelow(t *testing.T) {
	e := open(t, nil)
	s := e.send(t, "a@n1", "m0", "m1", "m2", "m3", "m4")
	tests := []struct {
		name string
		req  outbox.HeadRequest
		want []uint64
	}{
		{"max", outbox.HeadRequest{Max: 2}, s[:2]},
		{"zero max", outbox.HeadRequest{Max: 0}, nil},
		{"skip", outbox.HeadRequest{Max: 3, Skip: []uint64{s[0], s[2]}}, []uint64{s[1], s[3], s[4]}},
		{"skip unknown", outbox.HeadRequest{Max: 2, Skip: []uint64{s[1], s[4] + 100}}, []uint64{s[0], s[2]}},
		{"below", outbox.HeadRequest{Max: 10, Below: s[3]}, s[:3]},
		{"below the head", outbox.HeadRequest{Max: 10, Below: s[0]}, nil},
		{"skip and below", outbox.HeadRequest{Max: 10, Skip: s[:2], Below: s[4]}, s[2:4]},
		{"bytes: the first always comes", outbox.HeadRequest{Max: 10, MaxBytes: 1}, s[:1]},
		{"bytes: skipped ones do not count", outbox.HeadRequest{Max: 10, MaxBytes: 1, Skip: s[:3]}, s[3:4]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Recipient = "a@n1"
			msgs, wait, err := e.Head(tt.req)
			if err != nil || wait != 0 {
				t.Fatalf("head: %v, wait %d", err, wait)
			}
			var got []uint64
			for _, m := range msgs {
				got = append(got, m.GetEnvelope().GetSequence())
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
	if msgs, _, err := e.Head(outbox.HeadRequest{Recipient: "nobody@n1", Max: 5}); err != nil || len(msgs) != 0 {
		t.Fatalf("unknown recipient: %v %v", msgs, err)
	}
}

// Sequences handed out are covered by a durable high-water before they
// are returned: a copy of the file taken right after (a crash: nothing
// else was written) and a reopen with the wall clock set back by years
// both hand out only higher sequences.
func TestSequencesAboveEverythingHandedOut(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.SequenceBlock = 4 })
	var last uint64
	for range 10 { // three blocks
		s, err := e.ReserveSequence()
		if err != nil {
			t.Fatal(err)
		}
		if s <= last {
			t.Fatalf("sequence %d after %d", s, last)
		}
		last = s
	}
	if f := e.Stats().Fsyncs; f != 3 {
		t.Fatalf("%d commits for 10 sequences in blocks of 4, want 3", f)
	}
	// The crash copy: nothing was enqueued, only reserved.
	crash := filepath.Join(t.TempDir(), "crash.db")
	testutil.CopyFile(t, e.path, crash)
	c := mustOpen(t, config(crash, outbox.NewManualClock(epoch0.AddDate(-10, 0, 0)), nil))
	s, err := c.ReserveSequence()
	_ = c.Close()
	if err != nil || s <= last {
		t.Fatalf("after a crash: sequence %d (%v), want above %d", s, err, last)
	}

	// A stored sequence above the reserved high-water (a message enqueued
	// with a sequence from elsewhere; far above the clock's microseconds)
	// also raises it.
	high := uint64(epoch0.UnixMicro()) + 1<<40
	e.put(t, &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: high}})
	e.reopen(t, func(c *outbox.ManualClock) { c.Step(-10 * 365 * 24 * time.Hour) })
	s, err = e.ReserveSequence()
	if err != nil || s <= high {
		t.Fatalf("after reopen with the wall clock 10 years back: %d (%v), want above %d", s, err, high)
	}
}

func TestSecondOpenIsLocked(t *testing.T) {
	e := open(t, nil)
	cfg := config(e.path, e.clk, func(c *outbox.Config) { c.LockTimeout = 100 * time.Millisecond })
	start := time.Now()
	s2, err := outbox.Open(cfg)
	if err == nil {
		_ = s2.Close()
		t.Fatal("second Open of a locked file succeeded")
	}
	if !errors.Is(err, outbox.ErrLocked) {
		t.Fatalf("err = %v, want ErrLocked", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("ErrLocked after %v, want about the 100ms timeout", el)
	}
}

// Concurrent callers share commits: far fewer fsyncs than messages.
func TestGroupCommit(t *testing.T) {
	e := open(t, nil)
	const callers, each = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: fmt.Sprintf("a%d@n1", c%8), Type: fmt.Sprint(i)}}
				seq, err := e.ReserveSequence()
				if err == nil {
					sm.Envelope.Sequence = seq
					_, err = e.Enqueue(context.Background(), sm)
				}
				if err != nil {
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
	st := e.Stats()
	if st.Depth != callers*each {
		t.Fatalf("depth %d, want %d", st.Depth, callers*each)
	}
	if st.Fsyncs*4 > uint64(callers*each) {
		t.Fatalf("%d fsyncs for %d messages: group commit is not batching", st.Fsyncs, callers*each)
	}
	t.Logf("%d messages in %d commits", callers*each, st.Fsyncs)
}

func TestEnqueueBatch(t *testing.T) {
	e := open(t, nil)
	ok := func(r string) *pb.StoredMessage { return e.msg(t, r, r) }
	msgs := []*pb.StoredMessage{ok("a@n1"), nil, ok("b@n2"), {Envelope: &pb.Envelope{Recipient: "bad", Sequence: 9}}, ok("c@n3")}
	before := e.Stats().Fsyncs
	res, errs := e.EnqueueBatch(context.Background(), msgs)
	want := []error{nil, outbox.ErrNoRecipient, nil, outbox.ErrBadRecipient, nil}
	for i := range want {
		if (want[i] == nil && errs[i] != nil) || (want[i] != nil && !errors.Is(errs[i], want[i])) {
			t.Fatalf("errs[%d] = %v, want %v", i, errs[i], want[i])
		}
		if want[i] == nil && res[i] != outbox.Queued {
			t.Fatalf("res[%d] = %v", i, res[i])
		}
	}
	if st := e.Stats(); st.Depth != 3 || st.Fsyncs-before != 1 {
		t.Fatalf("depth %d in %d commits, want 3 in 1", st.Depth, st.Fsyncs-before)
	}
	// A message the committer refuses (its sequence is taken) fails alone.
	dup := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: msgs[0].GetEnvelope().GetSequence()}}
	_, errs = e.EnqueueBatch(context.Background(), []*pb.StoredMessage{ok("d@n1"), dup, ok("e@n1")})
	if errs[0] != nil || !errors.Is(errs[1], outbox.ErrBadMessage) || errs[2] != nil {
		t.Fatalf("errs %v, want [nil ErrBadMessage nil]", errs)
	}
	if st := e.Stats(); st.Depth != 5 {
		t.Fatalf("depth %d, want 5", st.Depth)
	}
}

// A fan-out of a 1 MiB body to 400 recipients is 400 MiB of records: it
// must be committed in transactions of at most MaxBatchBytes, not one.
// Under the race detector, which makes writing 400 MiB take half a
// minute, body and MaxBatchBytes are both scaled down by 16.
func TestEnqueueBatchSplitsByBytes(t *testing.T) {
	bodySize, mut := 1<<20, func(*outbox.Config) {}
	if raceEnabled || testing.Short() {
		bodySize, mut = 64<<10, func(c *outbox.Config) { c.MaxBatchBytes = 1 << 20 }
	}
	e := open(t, mut)
	body := &anypb.Any{TypeUrl: "type.googleapis.com/x", Value: make([]byte, bodySize)}
	const targets = 400
	msgs := make([]*pb.StoredMessage, targets)
	for i := range msgs {
		msgs[i] = e.msg(t, fmt.Sprintf("a%03d@n1", i), "big")
		msgs[i].Envelope.Body = body
	}
	before := e.Stats().Fsyncs
	_, errs := e.EnqueueBatch(context.Background(), msgs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("msg %d: %v", i, err)
		}
	}
	commits := e.Stats().Fsyncs - before
	perCommit := e.Config().MaxBatchBytes / bodySize // whole messages that fit
	if want := uint64((targets + perCommit - 1) / perCommit); commits < want {
		t.Fatalf("%d commits for %d bodies of %d bytes, want at least %d (MaxBatchBytes %d)",
			commits, targets, bodySize, want, e.Config().MaxBatchBytes)
	}
	t.Logf("%d x %d KiB in %d commits", targets, bodySize>>10, commits)
}

func TestOverwriteCoalesces(t *testing.T) {
	e := open(t, nil)
	ow := func(typ, key string) *pb.StoredMessage {
		sm := e.msg(t, "a@n1", typ)
		sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, key
		return sm
	}
	if _, err := e.ReserveSequence(); err != nil { // leaves room for an older version below v1
		t.Fatal(err)
	}
	v1 := ow("v1", "k")
	if r := e.put(t, v1); r != outbox.Queued {
		t.Fatalf("v1 %v", r)
	}
	e.send(t, "a@n1", "plain")
	e.put(t, ow("o1", "other"))
	if _, err := e.ReserveSequence(); err != nil { // room for an older version below v2
		t.Fatal(err)
	}
	v2 := ow("v2", "k")
	if r := e.put(t, v2); r != outbox.Replaced {
		t.Fatalf("v2 %v, want Replaced", r)
	}
	// The newer version sits at its own (newer) sequence, behind "plain".
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"plain", "o1", "v2"}) {
		t.Fatalf("queue %v", got)
	}
	// An older version arriving after a newer one is dropped.
	old := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "v0", Sequence: v1.GetEnvelope().GetSequence() - 1,
		Conflict: pb.Envelope_OVERWRITE, CoalesceKey: "k"}}
	if r := e.put(t, old); r != outbox.Superseded {
		t.Fatalf("older version %v, want Superseded", r)
	}
	// Also after the newest was delivered and acked.
	if err := e.Ack("a@n1", []uint64{v2.GetEnvelope().GetSequence()}); err != nil {
		t.Fatal(err)
	}
	old.Envelope.Sequence = v2.GetEnvelope().GetSequence() - 1
	old.Envelope.Type = "v1.5"
	if r := e.put(t, old); r != outbox.Superseded {
		t.Fatalf("older version after the newest was acked: %v, want Superseded", r)
	}
	// APPEND with a coalesce key and OVERWRITE without one never coalesce.
	a1, a2 := e.msg(t, "a@n1", "a1"), e.msg(t, "a@n1", "a2")
	a1.Envelope.CoalesceKey, a2.Envelope.CoalesceKey = "other", "other"
	n1, n2 := e.msg(t, "a@n1", "n1"), e.msg(t, "a@n1", "n2")
	n1.Envelope.Conflict, n2.Envelope.Conflict = pb.Envelope_OVERWRITE, pb.Envelope_OVERWRITE
	for _, sm := range []*pb.StoredMessage{a1, a2, n1, n2} {
		if r := e.put(t, sm); r != outbox.Queued {
			t.Fatalf("%s: %v", sm.GetEnvelope().GetType(), r)
		}
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"plain", "o1", "a1", "a2", "n1", "n2"}) {
		t.Fatalf("queue %v", got)
	}
	// The coalesce index survives a restart.
	e.reopen(t, nil)
	old.Envelope.Type = "v1.6"
	if r := e.put(t, old); r != outbox.Superseded {
		t.Fatalf("after restart: %v, want Superseded", r)
	}
	if st := e.Stats(); st.Depth != 6 {
		t.Fatalf("depth %d, want 6", st.Depth)
	}
}

func TestFailCountsOnlyCountedFailures(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.MaxAttempts = 3 })
	seqs := e.send(t, "a@n1", "m0", "m1", "m2")
	// Not counted: recorded as last_error only, however often.
	for range 10 {
		n, dead, err := e.Fail("a@n1", seqs[0], outbox.Failure{Reason: "capacity"})
		if err != nil || dead || n != 0 {
			t.Fatalf("uncounted failure: %d %v %v", n, dead, err)
		}
	}
	if m := e.head(t, "a@n1", 1)[0]; m.GetAttempts() != 0 || m.GetLastError() != "capacity" {
		t.Fatalf("after uncounted failures: attempts %d last error %q", m.GetAttempts(), m.GetLastError())
	}
	for i := 1; i <= 3; i++ {
		n, dead, err := e.Fail("a@n1", seqs[0], outbox.Failure{Reason: "handler: boom", Counts: true})
		if err != nil || n != i || dead != (i == 3) {
			t.Fatalf("counted failure %d: attempts %d dead %v err %v", i, n, dead, err)
		}
	}
	dl, err := e.DeadLetters(outbox.DLQFilter{Recipient: "a@n1"})
	if err != nil || len(dl) != 1 {
		t.Fatalf("dlq %v %v", dl, err)
	}
	if dl[0].Reason != "max attempts: handler: boom" || dl[0].Message.GetAttempts() != 3 || dl[0].Message.GetLastError() != "handler: boom" {
		t.Fatalf("dead letter %q attempts %d last error %q", dl[0].Reason, dl[0].Message.GetAttempts(), dl[0].Message.GetLastError())
	}
	// Permanent goes straight to the DLQ, whatever its count.
	if _, dead, err := e.Fail("a@n1", seqs[1], outbox.Failure{Reason: "rejected: bad body", Permanent: true}); !dead || err != nil {
		t.Fatalf("permanent: %v %v", dead, err)
	}
	// A message no longer queued is ignored.
	if n, dead, err := e.Fail("a@n1", seqs[0], outbox.Failure{Counts: true}); dead || err != nil || n != 0 {
		t.Fatalf("gone message: %d %v %v", n, dead, err)
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"m2"}) {
		t.Fatalf("queue %v", got)
	}
	dl, _ = e.DeadLetters(outbox.DLQFilter{Reason: "rejected"})
	if len(dl) != 1 || dl[0].Reason != "rejected: bad body" {
		t.Fatalf("permanent dead letter %+v", dl)
	}
	if st := e.Stats(); st.DeadLettered != 2 || st.DLQDepth != 2 || st.Retries != 12 || st.Depth != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDueDeferWake(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "1")
	e.send(t, "b@n1", "2")
	e.send(t, "c@n2", "3")
	now := e.ElapsedMs()
	due, _ := e.DueRecipients(now, nil, 10)
	slices.Sort(due)
	if !slices.Equal(due, []string{"a@n1", "b@n1", "c@n2"}) {
		t.Fatalf("due %v", due)
	}
	if due, next := e.DueRecipients(now, nil, 2); len(due) != 2 || next != now {
		t.Fatalf("limit: due %v next %d, want 2 and now", due, next)
	}
	if due, _ := e.DueRecipients(now, func(r string) bool { return r == "c@n2" }, 10); !slices.Equal(due, []string{"c@n2"}) {
		t.Fatalf("keep filter: %v", due)
	}
	e.Defer("a@n1", now+3_600_000)
	e.Defer("b@n1", now+60_000)
	e.Defer("nobody@n9", now+60_000) // no queue: ignored
	due, next := e.DueRecipients(now, nil, 10)
	if !slices.Equal(due, []string{"c@n2"}) || next != now+60_000 {
		t.Fatalf("after defer: due %v next %d, want [c@n2] and %d", due, next, now+60_000)
	}
	// next is the earliest kept recipient not yet due.
	if _, next := e.DueRecipients(now, func(r string) bool { return r == "a@n1" }, 10); next != now+3_600_000 {
		t.Fatalf("next of the kept one = %d", next)
	}
	e.WakeNode("n1")
	if due, _ := e.DueRecipients(e.ElapsedMs(), nil, 10); len(due) != 3 {
		t.Fatalf("after WakeNode: %v", due)
	}
	// A new enqueue does not cancel a deferral.
	e.Defer("a@n1", now+3_600_000)
	e.send(t, "a@n1", "4")
	if due, _ := e.DueRecipients(e.ElapsedMs(), func(r string) bool { return r == "a@n1" }, 10); len(due) != 0 {
		t.Fatalf("enqueue made a deferred recipient due: %v", due)
	}
	e.clk.Advance(time.Hour)
	if due, _ := e.DueRecipients(e.ElapsedMs(), func(r string) bool { return r == "a@n1" }, 10); len(due) != 1 {
		t.Fatalf("deferral over, still not due: %v", due)
	}
}

// Defer is persisted: a restart before the deferral ends keeps it, one
// after it has ended makes the queue due.
func TestDeferSurvivesRestart(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "m")
	e.send(t, "b@n1", "m")
	at := e.ElapsedMs() + time.Hour.Milliseconds()
	e.Defer("a@n1", at)
	sync_(t, e.Store) // Defer persists asynchronously
	e.reopen(t, func(c *outbox.ManualClock) { c.Advance(30 * time.Minute) })
	due, next := e.DueRecipients(e.ElapsedMs(), nil, 10)
	if !slices.Equal(due, []string{"b@n1"}) || next != at {
		t.Fatalf("after restart 30 min into a 1 h deferral: due %v next %d, want [b@n1] and %d", due, next, at)
	}
	e.reopen(t, func(c *outbox.ManualClock) { c.Advance(31 * time.Minute) })
	if due, _ := e.DueRecipients(e.ElapsedMs(), nil, 10); len(due) != 2 {
		t.Fatalf("after the deferral ended: due %v", due)
	}
}

// sync_ waits until every operation submitted before it has committed:
// the committer takes operations in order.
func sync_(tb testing.TB, s *outbox.Store) {
	tb.Helper()
	if err := s.Ack("sync@none", []uint64{1}); err != nil {
		tb.Fatal(err)
	}
}

func TestDropQueue(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.MaxBatch = 3 }) // several transactions per queue
	e.send(t, "a@n1", names("a", 7)...)
	e.send(t, "b@n1", names("b", 2)...)
	e.send(t, "c@n2", names("c", 2)...)
	n, err := e.DropQueue("a@n1", "operator")
	if err != nil || n != 7 {
		t.Fatalf("drop a@n1: %d %v", n, err)
	}
	if e.Pending("a@n1") != 0 || e.Pending("b@n1") != 2 {
		t.Fatalf("pending after dropping a@n1: %d %d", e.Pending("a@n1"), e.Pending("b@n1"))
	}
	e.send(t, "a@n1", "late")
	n, err = e.DropQueue("n1", "node left")
	if err != nil || n != 3 {
		t.Fatalf("drop n1: %d %v", n, err)
	}
	if st := e.Stats(); st.Depth != 2 || st.DepthByPeer["n2"] != 2 || st.DLQDepth != 10 {
		t.Fatalf("stats %+v", st)
	}
	dl, _ := e.DeadLetters(outbox.DLQFilter{Reason: "dropped: operator"})
	if len(dl) != 7 || dl[0].Message.GetEnvelope().GetType() != "a000" {
		t.Fatalf("%d dropped by the operator", len(dl))
	}
	dl, _ = e.DeadLetters(outbox.DLQFilter{Reason: "dropped: node left"})
	if len(dl) != 3 {
		t.Fatalf("%d dropped with the node", len(dl))
	}
	if n, err := e.DropQueue("nobody@n9", "x"); n != 0 || err != nil {
		t.Fatalf("unknown: %d %v", n, err)
	}
	// Replay brings them back.
	if n, err := e.Replay(outbox.DLQFilter{Reason: "dropped: operator"}); n != 7 || err != nil {
		t.Fatalf("replay: %d %v", n, err)
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, names("a", 7)) {
		t.Fatalf("replayed %v", got)
	}
}

func TestRestartKeepsEverything(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "1", "2")
	b := e.send(t, "b@n2", "3")
	e.send(t, "a@n1", "4")
	if _, dead, err := e.Fail("b@n2", b[0], outbox.Failure{Reason: "rejected", Permanent: true}); !dead || err != nil {
		t.Fatalf("permanent fail: %v %v", dead, err)
	}
	if _, _, err := e.Fail("a@n1", e.seqs(t, "a@n1")[0], outbox.Failure{Reason: "boom", Counts: true}); err != nil {
		t.Fatal(err)
	}
	if err := e.SetEpoch("a@n1", 77); err != nil {
		t.Fatal(err)
	}
	id := e.OutboxID()
	before := e.seqs(t, "a@n1")
	e.reopen(t, nil)
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"1", "2", "4"}) {
		t.Fatalf("queue after restart %v", got)
	}
	if got := e.seqs(t, "a@n1"); !slices.Equal(got, before) {
		t.Fatalf("sequences %v, want %v", got, before)
	}
	if m := e.head(t, "a@n1", 1)[0]; m.GetAttempts() != 1 || m.GetLastError() != "boom" {
		t.Fatalf("attempts not kept: %+v", m)
	}
	if dl, _ := e.DeadLetters(outbox.DLQFilter{}); len(dl) != 1 || dl[0].Recipient != "b@n2" {
		t.Fatalf("dlq after restart %+v", dl)
	}
	if ep, hw, err := e.StreamState("a@n1"); ep != 77 || hw != before[2] || err != nil {
		t.Fatalf("stream state %d %d %v, want 77 %d", ep, hw, err, before[2])
	}
	if e.OutboxID() != id || id == [16]byte{} {
		t.Fatalf("outbox id changed or zero: %x -> %x", id, e.OutboxID())
	}
	st := e.Stats()
	if st.Depth != 3 || st.DLQDepth != 1 || st.DepthByPeer["n1"] != 3 {
		t.Fatalf("stats after restart %+v", st)
	}
}

// The stream record keeps the epoch once set, and the high-water only
// while messages wait.
func TestStreamState(t *testing.T) {
	e := open(t, nil)
	if ep, hw, err := e.StreamState("a@n1"); ep != 0 || hw != 0 || err != nil {
		t.Fatalf("unknown stream: %d %d %v", ep, hw, err)
	}
	s := e.send(t, "a@n1", "m0", "m1")
	if _, hw, _ := e.StreamState("a@n1"); hw != s[1] {
		t.Fatalf("high-water %d, want %d", hw, s[1])
	}
	if err := e.SetEpoch("a@n1", 5); err != nil {
		t.Fatal(err)
	}
	if err := e.Ack("a@n1", s); err != nil {
		t.Fatal(err)
	}
	if ep, hw, _ := e.StreamState("a@n1"); ep != 5 || hw != 0 {
		t.Fatalf("after drain: epoch %d high-water %d, want 5 and 0", ep, hw)
	}
	// An epoch set while nothing waits is kept too.
	if err := e.SetEpoch("b@n1", 9); err != nil {
		t.Fatal(err)
	}
	e.reopen(t, nil)
	if ep, _, _ := e.StreamState("b@n1"); ep != 9 {
		t.Fatalf("epoch of an empty stream lost: %d", ep)
	}
}

// WakeNode cancels a deferral at once, even when the deferral's own
// asynchronous write commits after it: the peer came back, its queue is
// due now.
func TestWakeNodeBeatsPendingDeferWrite(t *testing.T) {
	e := open(t, nil)
	e.send(t, "a@n1", "m")
	release := stall(t, e.Store)
	e.Defer("a@n1", e.ElapsedMs()+time.Hour.Milliseconds()) // its write waits for the committer
	e.WakeNode("n1")
	release()
	sync_(t, e.Store)
	if due, _ := e.DueRecipients(e.ElapsedMs(), nil, 10); !slices.Equal(due, []string{"a@n1"}) {
		t.Fatalf("due %v after WakeNode: the deferral's late commit deferred the queue again", due)
	}
}

func TestClosed(t *testing.T) {
	e := open(t, nil)
	sm := e.msg(t, "a@n1", "m1")
	e.put(t, sm)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	checks := map[string]error{"close": e.Close(), "ack": e.Ack("a@n1", []uint64{1})}
	_, checks["enqueue"] = e.Enqueue(ctx, e.msgNoReserve("a@n1"))
	_, _, checks["head"] = e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 1})
	_, _, checks["fail"] = e.Fail("a@n1", 1, outbox.Failure{Counts: true})
	_, checks["expire"] = e.Expire("a@n1", []uint64{1}, outbox.ReasonExpired)
	_, checks["reserve"] = e.ReserveSequence()
	_, checks["replay"] = e.Replay(outbox.DLQFilter{All: true})
	_, checks["purge"] = e.Purge(outbox.DLQFilter{All: true})
	_, checks["list"] = e.DeadLetters(outbox.DLQFilter{})
	_, checks["drop"] = e.DropQueue("a@n1", "x")
	_, _, checks["watermark"] = e.Watermark([]byte("s"))
	_, checks["key seen"] = e.KeySeen([]byte("k"))
	checks["set epoch"] = e.SetEpoch("a@n1", 3)
	checks["dead letter"] = e.DeadLetter(ctx, e.msgNoReserve("a@n1"), "x")
	done := make(chan error, 1)
	e.CommitStream(&outbox.StreamCommit{Stream: []byte("s"), Watermark: 1}, func(err error) { done <- err })
	checks["commit stream"] = <-done
	for name, err := range checks {
		if !errors.Is(err, outbox.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
	e.Defer("a@n1", 1) // must neither block nor panic
}

func (e *env) msgNoReserve(recipient string) *pb.StoredMessage {
	return &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: recipient, Sequence: 424242}}
}

// MaxBatchBytes bounds a transaction, not only one caller's group: byte-
// heavy groups of several callers queued together are not gathered into
// one transaction either.
func TestCommitterBoundsBytesAcrossCallers(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.MaxBatchBytes = 1 << 20 })
	body := &anypb.Any{Value: make([]byte, 900<<10)}
	const callers = 4
	msgs := make([]*pb.StoredMessage, callers)
	for i := range msgs {
		msgs[i] = e.msg(t, fmt.Sprintf("a%d@n1", i), "big")
		msgs[i].Envelope.Body = body
	}
	release := stall(t, e.Store)
	before := e.Stats().Fsyncs
	var wg sync.WaitGroup
	for _, sm := range msgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, errs := e.EnqueueBatch(context.Background(), []*pb.StoredMessage{sm}); errs[0] != nil {
				t.Error(errs[0])
			}
		}()
	}
	waitQueued(t, e.Store, callers)
	release()
	wg.Wait()
	if commits := e.Stats().Fsyncs - before; commits < callers {
		t.Fatalf("%d callers of 900 KiB each committed in %d transactions; MaxBatchBytes is 1 MiB", callers, commits)
	}
}

// waitQueued waits until n operations wait for the (stalled) committer.
func waitQueued(tb testing.TB, s *outbox.Store, n int) {
	tb.Helper()
	testutil.WaitFor(tb, 10*time.Second, fmt.Sprintf("%d operations queued", n), func() bool { return outbox.QueuedOps(s) >= n })
}

// DropQueue and Replay rewrite every record they move: like a fan-out,
// they are cut into transactions of at most MaxBatchBytes.
func TestDropAndReplayBoundedByBytes(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.MaxBatchBytes = 1 << 20 })
	body := &anypb.Any{Value: make([]byte, 64<<10)}
	const n = 64 // 4 MiB in all
	msgs := make([]*pb.StoredMessage, n)
	for i := range msgs {
		msgs[i] = e.msg(t, "a@n1", fmt.Sprint(i))
		msgs[i].Envelope.Body = body
	}
	if _, errs := e.EnqueueBatch(context.Background(), msgs); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	for _, step := range []struct {
		name string
		run  func() (int, error)
	}{
		{"drop", func() (int, error) { return e.DropQueue("a@n1", "x") }},
		{"replay", func() (int, error) { return e.Replay(outbox.DLQFilter{Recipient: "a@n1"}) }},
	} {
		before := e.Stats().Fsyncs
		if got, err := step.run(); got != n || err != nil {
			t.Fatalf("%s: %d %v", step.name, got, err)
		}
		if commits := e.Stats().Fsyncs - before; commits < 4 {
			t.Fatalf("%s of 4 MiB in %d transactions; MaxBatchBytes is 1 MiB", step.name, commits)
		}
	}
	if got := e.types(t, "a@n1"); len(got) != n || got[0] != "0" || got[n-1] != fmt.Sprint(n-1) {
		t.Fatalf("after drop and replay: %d messages, %v...", len(got), got[:3])
	}
}

// NoteVersion makes a version delivered without being stored (a direct
// attempt) count in the coalesce index, across a reopen: older versions are
// refused.
func TestNoteVersionCountsInTheIndex(t *testing.T) {
	e := open(t, nil)
	lo, _ := e.ReserveSequence()
	mid, _ := e.ReserveSequence()
	hi, _ := e.ReserveSequence()
	for _, n := range []struct {
		rcpt string
		seq  uint64
	}{{"a@n1", mid}, {"a@n1", lo} /* never lowers it */, {"bad", hi} /* ignored */} {
		if err := e.NoteVersion(context.Background(), n.rcpt, "k", n.seq); err != nil {
			t.Fatal(err)
		}
	}
	e.reopen(t, nil)
	ow := func(seq uint64) *pb.StoredMessage {
		return &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: seq, Conflict: pb.Envelope_OVERWRITE, CoalesceKey: "k"}}
	}
	if r := e.put(t, ow(lo)); r != outbox.Superseded {
		t.Fatalf("older than the recorded version: %v, want Superseded", r)
	}
	if r := e.put(t, ow(hi)); r != outbox.Queued {
		t.Fatalf("newer than the recorded version: %v, want Queued", r)
	}
}

// A message the committer cannot encode (a string field that is not
// UTF-8, which protobuf refuses to marshal) fails alone and leaves
// nothing behind: no expiry index entry for the sweeper to chase, no
// coalesce version to supersede later messages, no replaced message lost.
func TestUnencodableMessageLeavesNothingBehind(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.MaxClockSkew = 0 })
	v1 := e.msg(t, "a@n1", "v1")
	v1.Envelope.Conflict, v1.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "k"
	e.put(t, v1)
	bad := e.msg(t, "a@n1", "bad\xff")
	bad.Envelope.TtlMs = 1000
	bad.Envelope.Conflict, bad.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "k"
	if _, err := e.Enqueue(context.Background(), bad); err == nil {
		t.Fatal("a message protobuf cannot marshal was stored")
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"v1"}) {
		t.Fatalf("queue %v: the waiting version was replaced by one that was never stored", got)
	}
	e.clk.Advance(2 * time.Second)
	if c, _, err := e.ExpiryCandidates(e.ElapsedMs(), 10); err != nil || len(c) != 0 {
		t.Fatalf("expiry candidates %+v (%v): the failed message left an index entry", c, err)
	}
	v2 := e.msg(t, "a@n1", "v2")
	v2.Envelope.Conflict, v2.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "k"
	if r := e.put(t, v2); r != outbox.Replaced {
		t.Fatalf("next version: %v, want Replaced (of v1)", r)
	}
}

// A sequence is refused when taken, whether the record holding it was
// stored by an earlier commit or earlier in the same one, below or at
// the highest sequence stored; a free one below the highest is stored.
func TestTakenSequenceIsRefusedInTheSameCommitAndAfter(t *testing.T) {
	e := open(t, nil)
	var s [3]uint64
	for i := range s {
		seq, err := e.ReserveSequence()
		if err != nil {
			t.Fatal(err)
		}
		s[i] = seq
	}
	m := func(seq uint64, typ string) *pb.StoredMessage {
		return &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: typ, Sequence: seq}}
	}
	_, errs := e.EnqueueBatch(context.Background(), []*pb.StoredMessage{m(s[1], "b"), m(s[1], "b twin"), m(s[0], "a"), m(s[2], "c"), m(s[2], "c twin")})
	for i, want := range []error{nil, outbox.ErrBadMessage, nil, nil, outbox.ErrBadMessage} {
		if !errors.Is(errs[i], want) || (want == nil) != (errs[i] == nil) {
			t.Fatalf("message %d in one commit: %v, want %v", i, errs[i], want)
		}
	}
	for _, seq := range []uint64{s[0], s[1], s[2]} {
		if _, err := e.Enqueue(context.Background(), m(seq, "later twin")); !errors.Is(err, outbox.ErrBadMessage) {
			t.Fatalf("sequence %d again in a later commit: %v, want ErrBadMessage", seq, err)
		}
	}
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("queue %v, want [a b c]", got)
	}
}

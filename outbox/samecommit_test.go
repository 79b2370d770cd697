package outbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Several writes of one queue committed in one transaction: the committer
// joins concurrent callers, so an ack or a drop of a whole queue and the
// next enqueue to it, or a sync and an async enqueue, can share a commit.

// inChild runs the calling test alone in a child process of the test binary
// and fails it when the child does not finish within limit (a committer
// spinning forever cannot be cleaned up in-process) or fails itself.
// It returns true in the child, which then runs the scenario.
func inChild(t *testing.T, limit time.Duration) bool {
	t.Helper()
	if os.Getenv("OUTBOX_TEST_CHILD") == t.Name() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "OUTBOX_TEST_CHILD="+t.Name())
	// On timeout the child dumps its goroutines (SIGQUIT) before it dies.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = 3 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the scenario did not finish within %v: the store hangs; committer:\n%s", limit, committerStack(string(out)))
	}
	if err != nil {
		t.Fatalf("child failed: %v\n%s", err, out)
	}
	return false
}

// committerStack picks the goroutine running the store's committer out of
// a SIGQUIT dump.
func committerStack(dump string) string {
	for _, g := range strings.Split(dump, "\n\n") {
		if strings.Contains(g, "outbox.(*Store).run(") {
			return g
		}
	}
	return dump
}

// bigMsg is a message with a body of n bytes, so that a few dozen of them
// fill several bbolt leaf pages.
func (e *env) bigMsg(tb testing.TB, recipient, typ string, n int) *pb.StoredMessage {
	sm := e.msg(tb, recipient, typ)
	sm.Envelope.Body = &anypb.Any{TypeUrl: "t", Value: []byte(strings.Repeat("x", n))}
	return sm
}

// emptyThenEnqueue fills a@n1 with 100 messages of 200 B (several leaf
// pages), then commits empty (given the queued sequences) and an enqueue
// to the same queue in one transaction. The enqueue must be stored.
func emptyThenEnqueue(t *testing.T, empty func(e *env, seqs []uint64) error) {
	e := open(t, nil)
	var msgs []*pb.StoredMessage
	for i := range 100 {
		msgs = append(msgs, e.bigMsg(t, "a@n1", names("m", 100)[i], 200))
	}
	_, errs := e.EnqueueBatch(context.Background(), msgs)
	var seqs []uint64
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, msgs[i].GetEnvelope().GetSequence())
	}
	next := e.msg(t, "a@n1", "next") // reserved before the committer stalls
	release := stall(t, e.Store)
	emptied := make(chan error, 1)
	go func() { emptied <- empty(e, seqs) }()
	waitOps(t, e.Store, 1)
	stored := make(chan error, 1)
	if err := e.EnqueueAsync(context.Background(), next, func(_ outbox.Result, err error) { stored <- err }); err != nil {
		t.Fatal(err)
	}
	waitOps(t, e.Store, 2)
	release()
	if err := <-emptied; err != nil {
		t.Fatal(err)
	}
	if err := <-stored; err != nil {
		t.Fatal(err)
	}
	if got := e.types(t, "a@n1"); len(got) != 1 || got[0] != "next" {
		t.Fatalf("queue holds %v, want [next]", got)
	}
}

// An Ack that empties a multi-page queue and an Enqueue to the same queue
// committed in one transaction: the relay acks a drained queue while the
// application sends the next message.
func TestEnqueueAfterAckEmptiedQueueSameCommit(t *testing.T) {
	if !inChild(t, 8*time.Second) {
		return
	}
	emptyThenEnqueue(t, func(e *env, seqs []uint64) error { return e.Ack("a@n1", seqs) })
}

// waitOps waits until n operations wait for the (stalled) committer.
func waitOps(t *testing.T, s *outbox.Store, n int) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("%d ops queued for the committer", n), func() bool { return outbox.QueuedOps(s) >= n })
}

// The same sequence from a sync and an async enqueue in one commit: one is
// stored, the other refused.
func TestSameSequenceSyncAndAsyncSameCommit(t *testing.T) {
	e := open(t, nil)
	a := e.msg(t, "a@n1", "a")
	b := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "b", Sequence: a.GetEnvelope().GetSequence()}}
	release := stall(t, e.Store)
	ares := make(chan error, 1)
	if err := e.EnqueueAsync(context.Background(), a, func(_ outbox.Result, err error) { ares <- err }); err != nil {
		t.Fatal(err)
	}
	bres := make(chan error, 1)
	go func() { _, err := e.Enqueue(context.Background(), b); bres <- err }()
	waitOps(t, e.Store, 2)
	release()
	if err := <-ares; err != nil {
		t.Fatalf("first: %v", err)
	}
	if err := <-bres; err == nil {
		t.Fatal("second with the same sequence was accepted")
	}
	if got := e.types(t, "a@n1"); len(got) != 1 || got[0] != "a" {
		t.Fatalf("queue %v", got)
	}
}

// Out-of-order sequences and duplicates (of stored and of same-batch
// messages) in one EnqueueBatch, mixed with messages refused before the
// commit.
func TestEnqueueBatchOrderDuplicatesAndRefused(t *testing.T) {
	e := open(t, nil)
	seqs := e.send(t, "a@n1", "s0", "s1", "s2")
	hi := e.msg(t, "a@n1", "hi")
	mid := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "mid", Sequence: seqs[2] - 1}} // = s1: dup of stored
	e.Ack("a@n1", []uint64{seqs[0]})
	re0 := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "re0", Sequence: seqs[0]}} // acked: free again
	dupHi := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "duphi", Sequence: hi.GetEnvelope().GetSequence()}}
	bad := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "bad\xff", Sequence: hi.GetEnvelope().GetSequence() + 100}}
	noseq := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "noseq"}}
	other := e.msg(t, "b@n1", "other")
	msgs := []*pb.StoredMessage{hi, bad, mid, re0, noseq, dupHi, other}
	_, errs := e.EnqueueBatch(context.Background(), msgs)
	want := []bool{true, false, false, true, false, false, true}
	for i, ok := range want {
		if (errs[i] == nil) != ok {
			t.Errorf("msg %d (%s): err %v, want ok=%v", i, msgs[i].GetEnvelope().GetType(), errs[i], ok)
		}
	}
	e.reopen(t, nil)
	if got := strings.Join(e.types(t, "a@n1"), ","); got != "re0,s1,s2,hi" {
		t.Fatalf("a@n1 = %s", got)
	}
	if got := strings.Join(e.types(t, "b@n1"), ","); got != "other" {
		t.Fatalf("b@n1 = %s", got)
	}
}

// Messages read through Head own their memory: growing the file (which
// remaps bbolt's mmap) and rewriting the records changes nothing in them.
func TestHeadMessagesOwnTheirMemory(t *testing.T) {
	e := open(t, nil)
	sm := e.bigMsg(t, "a@n1", "typ", 300)
	sm.Envelope.Headers = map[string]string{"k1": "v1", "k2": strings.Repeat("h", 50)}
	sm.Envelope.Rpc = &pb.RpcMeta{Service: "svc", Method: "m", CorrelationId: "c"}
	sm.Envelope.CoalesceKey, sm.Envelope.IdempotencyKey, sm.LastError = "ck", "ik", "err"
	e.put(t, sm)
	got := e.head(t, "a@n1", 1)[0]
	snap := proto.Clone(got).(*pb.StoredMessage)
	// Fail rewrites the record in place; then grow the file a lot.
	if _, _, err := e.Fail("a@n1", sm.GetEnvelope().GetSequence(), outbox.Failure{Reason: strings.Repeat("Z", 300), Counts: true}); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		var batch []*pb.StoredMessage
		for range 50 {
			batch = append(batch, e.bigMsg(t, "g@n1", "g", 4000))
		}
		if _, errs := e.EnqueueBatch(context.Background(), batch); errs[0] != nil {
			t.Fatal(i, errs[0])
		}
	}
	if err := e.Ack("a@n1", []uint64{sm.GetEnvelope().GetSequence()}); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, snap) {
		t.Fatalf("a message read earlier changed:\n got %v\nwant %v", got, snap)
	}
}

// Versions of one coalesce key, with TTLs, in one commit, in and out of
// sequence order: the newest is kept, the others leave no expiry entry.
func TestCoalesceVersionsSameCommit(t *testing.T) {
	e := open(t, nil)
	ver := func(typ string) *pb.StoredMessage {
		sm := e.msg(t, "a@n1", typ)
		sm.Envelope.Conflict, sm.Envelope.CoalesceKey, sm.Envelope.TtlMs = pb.Envelope_OVERWRITE, "k", 60_000
		return sm
	}
	v1, v2, v3, v4 := ver("v1"), ver("v2"), ver("v3"), ver("v4")
	plain := e.msg(t, "a@n1", "plain")
	plain.Envelope.TtlMs = 60_000
	release := stall(t, e.Store)
	type res struct {
		r   outbox.Result
		err error
	}
	out := make(chan res, 5)
	for _, sm := range []*pb.StoredMessage{v2, v1, plain, v4, v3} {
		if err := e.EnqueueAsync(context.Background(), sm, func(r outbox.Result, err error) { out <- res{r, err} }); err != nil {
			t.Fatal(err)
		}
	}
	waitOps(t, e.Store, 5)
	release()
	var got []outbox.Result
	for range 5 {
		r := <-out
		if r.err != nil {
			t.Fatal(r.err)
		}
		got = append(got, r.r)
	}
	want := []outbox.Result{outbox.Queued, outbox.Superseded, outbox.Queued, outbox.Replaced, outbox.Superseded}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("results %v, want %v", got, want)
		}
	}
	e.reopen(t, nil)
	if g := strings.Join(e.types(t, "a@n1"), ","); g != "v4,plain" {
		t.Fatalf("queue %s", g)
	}
	st, err := outbox.BucketStats(e.Store, "exp")
	if err != nil {
		t.Fatal(err)
	}
	if st.KeyN != 2 {
		t.Fatalf("%d expiry entries, want 2", st.KeyN)
	}
	e.clk.Advance(61 * time.Second)
	cands, _, err := e.ExpiryCandidates(e.ElapsedMs(), 10)
	if err != nil || len(cands) != 2 {
		t.Fatalf("candidates %v, %v", cands, err)
	}
}

// The same with the operator's DropQueue: it moves a whole multi-page queue
// to the dead-letter queue while the application enqueues to it.
func TestEnqueueAfterDropQueueSameCommit(t *testing.T) {
	if !inChild(t, 8*time.Second) {
		return
	}
	emptyThenEnqueue(t, func(e *env, _ []uint64) error {
		_, err := e.DropQueue("a@n1", "operator")
		return err
	})
}

// A message refused for invalid UTF-8 (the fallback encoder) leaves nothing
// behind; small MaxBatchBytes groups by record size and keeps every message.
func TestRefusedLeavesNothingAndSmallBatches(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.MaxBatchBytes = 300 })
	bad := e.msg(t, "z@n1", "bad")
	bad.Envelope.Headers = map[string]string{"k": "\xff"}
	bad.Envelope.TtlMs, bad.Envelope.Conflict, bad.Envelope.CoalesceKey = 60_000, pb.Envelope_OVERWRITE, "k"
	if _, err := e.Enqueue(context.Background(), bad); err == nil {
		t.Fatal("invalid UTF-8 accepted")
	}
	for _, b := range []string{"q", "exp", "coalesce", "out"} {
		st, err := outbox.BucketStats(e.Store, b)
		if err != nil || st.KeyN != 0 || (b == "q" && st.BucketN > 1) {
			t.Fatalf("bucket %s: %+v, %v", b, st, err)
		}
	}
	var msgs []*pb.StoredMessage
	for i := range 30 {
		msgs = append(msgs, e.bigMsg(t, "a@n1", names("m", 30)[i], 120))
	}
	msgs[7].Envelope.Type = "\xff"
	_, errs := e.EnqueueBatch(context.Background(), msgs)
	var want []string
	for i, err := range errs {
		if (err != nil) != (i == 7) {
			t.Fatalf("msg %d: %v", i, err)
		}
		if i != 7 {
			want = append(want, msgs[i].GetEnvelope().GetType())
		}
	}
	e.reopen(t, nil)
	if got := strings.Join(e.types(t, "a@n1"), ","); got != strings.Join(want, ",") {
		t.Fatalf("stored %s", got)
	}
}

package outbox_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// epoch0 is where every test's ManualClock starts.
var epoch0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// env is a test store: the store, its file and the manual clock it runs on.
type env struct {
	*outbox.Store
	path string
	clk  *outbox.ManualClock
	mut  func(*outbox.Config)
}

// config returns the test configuration for path on clk: a short lock
// timeout, then mut.
func config(path string, clk outbox.Clock, mut func(*outbox.Config)) outbox.Config {
	cfg := outbox.DefaultConfig(path)
	cfg.LockTimeout = 200 * time.Millisecond
	cfg.Clock = clk
	if mut != nil {
		mut(&cfg)
	}
	return cfg
}

// open opens a fresh store in tb.TempDir on a ManualClock; cleanup closes
// whichever store e holds then (reopen replaces it).
func open(tb testing.TB, mut func(*outbox.Config)) *env {
	tb.Helper()
	e := &env{path: filepath.Join(tb.TempDir(), "outbox.db"), clk: outbox.NewManualClock(epoch0), mut: mut}
	e.Store = mustOpen(tb, config(e.path, e.clk, mut))
	tb.Cleanup(func() { _ = e.Close() })
	return e
}

func mustOpen(tb testing.TB, cfg outbox.Config) *outbox.Store {
	tb.Helper()
	s, err := outbox.Open(cfg)
	if err != nil {
		tb.Fatalf("open %s: %v", cfg.Path, err)
	}
	return s
}

// reopen closes the store and opens its file again with the same clock;
// between may move the clock while the store is closed.
func (e *env) reopen(tb testing.TB, between func(*outbox.ManualClock)) {
	tb.Helper()
	if err := e.Close(); err != nil {
		tb.Fatalf("close: %v", err)
	}
	if between != nil {
		between(e.clk)
	}
	e.Store = mustOpen(tb, config(e.path, e.clk, e.mut))
}

// msg builds a stored message for recipient with a fresh sequence.
func (e *env) msg(tb testing.TB, recipient, typ string) *pb.StoredMessage {
	tb.Helper()
	seq, err := e.ReserveSequence()
	if err != nil {
		tb.Fatalf("reserve: %v", err)
	}
	return &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: recipient, Sender: "app@n0", Type: typ, Sequence: seq}}
}

// put enqueues sm and fails tb on an error.
func (e *env) put(tb testing.TB, sm *pb.StoredMessage) outbox.Result {
	tb.Helper()
	res, err := e.Enqueue(context.Background(), sm)
	if err != nil {
		tb.Fatalf("enqueue %s: %v", sm.GetEnvelope().GetType(), err)
	}
	return res
}

// send enqueues one message per type for recipient, in order, and returns
// their sequences.
func (e *env) send(tb testing.TB, recipient string, typs ...string) []uint64 {
	tb.Helper()
	var seqs []uint64
	for _, t := range typs {
		sm := e.msg(tb, recipient, t)
		e.put(tb, sm)
		seqs = append(seqs, sm.GetEnvelope().GetSequence())
	}
	return seqs
}

// head returns up to n messages of recipient's queue as if none had ever
// been sent.
func (e *env) head(tb testing.TB, recipient string, n int) []*pb.StoredMessage {
	tb.Helper()
	msgs, _, err := e.Head(outbox.HeadRequest{Recipient: recipient, Max: n})
	if err != nil {
		tb.Fatalf("head %s: %v", recipient, err)
	}
	return msgs
}

func (e *env) types(tb testing.TB, recipient string) []string {
	tb.Helper()
	var out []string
	for _, m := range e.head(tb, recipient, 1<<20) {
		out = append(out, m.GetEnvelope().GetType())
	}
	return out
}

func (e *env) seqs(tb testing.TB, recipient string) []uint64 {
	tb.Helper()
	var out []uint64
	for _, m := range e.head(tb, recipient, 1<<20) {
		out = append(out, m.GetEnvelope().GetSequence())
	}
	return out
}

// stall blocks the store's committer until release is called: a
// CommitStream whose done callback waits, which the committer calls after
// its commit. Operations submitted meanwhile queue up and are committed
// together after release, which is how the tests build a backlog at a
// known point. Cleanup releases it if the test did not.
func stall(tb testing.TB, s *outbox.Store) (release func()) {
	tb.Helper()
	return outbox.Stall(tb, s)
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

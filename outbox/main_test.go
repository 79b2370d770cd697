package outbox_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a settable clock for Config.Now.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// openAt opens a store at path with a fast lock timeout; mut may adjust cfg.
func openAt(tb testing.TB, path string, mut func(*outbox.Config)) *outbox.Store {
	tb.Helper()
	cfg := outbox.DefaultConfig(path)
	cfg.LockTimeout = 200 * time.Millisecond
	if mut != nil {
		mut(&cfg)
	}
	s, err := outbox.Open(cfg)
	if err != nil {
		tb.Fatalf("open %s: %v", path, err)
	}
	return s
}

// openTemp opens a fresh store in tb.TempDir and closes it on cleanup.
func openTemp(tb testing.TB, mut func(*outbox.Config)) (*outbox.Store, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "outbox.db")
	s := openAt(tb, path, mut)
	tb.Cleanup(func() { _ = s.Close() })
	return s, path
}

func mkEnv(recipient string, body string) *pb.Envelope {
	return &pb.Envelope{Recipient: recipient, Sender: "app@n0", Type: body, MsgId: body}
}

func enqueue(tb testing.TB, s *outbox.Store, envs ...*pb.Envelope) {
	tb.Helper()
	for _, e := range envs {
		if err := s.Enqueue(context.Background(), e); err != nil {
			tb.Fatalf("enqueue %s: %v", e.GetType(), err)
		}
	}
}

// types returns the Type field of every message at recipient's head (up to n).
func types(tb testing.TB, s *outbox.Store, recipient string, n int) []string {
	tb.Helper()
	msgs, err := s.Head(recipient, n)
	if err != nil {
		tb.Fatalf("head %s: %v", recipient, err)
	}
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.GetEnvelope().GetType()
	}
	return out
}

func seqs(tb testing.TB, s *outbox.Store, recipient string, n int) []uint64 {
	tb.Helper()
	msgs, err := s.Head(recipient, n)
	if err != nil {
		tb.Fatalf("head: %v", err)
	}
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.GetEnvelope().GetSequence()
	}
	return out
}

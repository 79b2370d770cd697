package inbox_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

func openStore(tb testing.TB, path string, mutate func(*inbox.Config)) *inbox.Store {
	tb.Helper()
	cfg := inbox.DefaultConfig(path)
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := inbox.Open(cfg)
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

func env(id string) *pb.Envelope { return &pb.Envelope{MsgId: id, Recipient: "box@n1"} }

func appendN(tb testing.TB, s *inbox.Store, name string, from, n int) {
	tb.Helper()
	for i := from; i < from+n; i++ {
		if _, err := s.Append(context.Background(), name, env(fmt.Sprint("m", i))); err != nil {
			tb.Fatalf("append %d: %v", i, err)
		}
	}
}

func ids(msgs []*pb.Envelope) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.GetMsgId()
	}
	return out
}

func TestAppendPullAckRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	s := openStore(t, path, nil)
	if created, err := s.Declare("box"); err != nil || !created {
		t.Fatalf("declare: %v %v", created, err)
	}
	if created, err := s.Declare("box"); err != nil || created {
		t.Fatalf("second declare: created=%v err=%v, want false nil", created, err)
	}
	appendN(t, s, "box", 0, 5)
	msgs, err := s.Pull(context.Background(), "box", 0, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ids(msgs)); got != "[m0 m1 m2]" {
		t.Fatalf("pull = %s", got)
	}
	for i, m := range msgs {
		if m.GetEventSeq() != uint64(i+1) {
			t.Fatalf("cursor of %s = %d, want %d", m.GetMsgId(), m.GetEventSeq(), i+1)
		}
	}
	if n, err := s.AckUpTo("box", 2); err != nil || n != 2 {
		t.Fatalf("ack 2: n=%d err=%v", n, err)
	}
	// A program restarting from its last ack (2) sees 3, 4, 5 again: pulled but unacked included.
	msgs, _ = s.Pull(context.Background(), "box", 2, 100, 0)
	if got := fmt.Sprint(ids(msgs)); got != "[m2 m3 m4]" {
		t.Fatalf("pull after ack = %s", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}

	s2 := openStore(t, path, nil)
	if got := s2.Inboxes(); fmt.Sprint(got) != "[box]" {
		t.Fatalf("inboxes after restart = %v", got)
	}
	msgs, _ = s2.Pull(context.Background(), "box", 0, 100, 0)
	if got := fmt.Sprint(ids(msgs)); got != "[m2 m3 m4]" {
		t.Fatalf("pull after restart = %s (acked ones must be gone, unacked kept)", got)
	}
	// Cursors keep growing after a restart.
	cur, err := s2.Append(context.Background(), "box", env("m5"))
	if err != nil || cur != 6 {
		t.Fatalf("append after restart: cursor %d err %v, want 6", cur, err)
	}
	if st := s2.Stats()["box"]; st.Depth != 4 || st.LastCursor != 6 {
		t.Fatalf("stats = %+v", st)
	}
	// Ack everything, restart, cursors still monotonic.
	if n, err := s2.AckUpTo("box", 6); err != nil || n != 4 {
		t.Fatalf("ack all: %d %v", n, err)
	}
	_ = s2.Close()
	s3 := openStore(t, path, nil)
	if cur, _ := s3.Append(context.Background(), "box", env("m6")); cur != 7 {
		t.Fatalf("cursor after all acked and restart = %d, want 7", cur)
	}
}

func TestAckRules(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), nil)
	_, _ = s.Declare("box")
	appendN(t, s, "box", 0, 3)
	tests := []struct {
		name    string
		upTo    uint64
		deleted int
		err     error
	}{
		{"beyond last stored is refused", 4, 0, inbox.ErrAckBeyond},
		{"far beyond is refused", 1 << 40, 0, inbox.ErrAckBeyond},
		{"zero is a no-op", 0, 0, nil},
		{"partial", 1, 1, nil},
		{"again is idempotent", 1, 0, nil},
		{"the rest", 3, 2, nil},
		{"below is a no-op", 2, 0, nil},
	}
	if _, err := s.Pull(context.Background(), "box", 4, 10, 0); !errors.Is(err, inbox.ErrPullBeyond) {
		t.Fatalf("pull after a cursor never handed out = %v, want ErrPullBeyond", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := s.AckUpTo("box", tt.upTo)
			if !errors.Is(err, tt.err) || n != tt.deleted {
				t.Fatalf("AckUpTo(%d) = %d, %v; want %d, %v", tt.upTo, n, err, tt.deleted, tt.err)
			}
		})
	}
	if _, err := s.AckUpTo("nope", 1); !errors.Is(err, inbox.ErrNoSuchInbox) {
		t.Fatalf("ack unknown inbox: %v", err)
	}
}

func TestBound(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), func(c *inbox.Config) { c.MaxMessages = 10 })
	_, _ = s.Declare("box")
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, full := 0, 0
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Append(context.Background(), "box", env(fmt.Sprint(i)))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, inbox.ErrFull):
				full++
			default:
				t.Errorf("append: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok != 10 || full != 20 {
		t.Fatalf("ok=%d full=%d, want 10 and 20", ok, full)
	}
	if _, err := s.AckUpTo("box", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(context.Background(), "box", env("again")); err != nil {
		t.Fatalf("append after ack freed room: %v", err)
	}
}

func TestLongPoll(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), nil)
	_, _ = s.Declare("box")
	got := make(chan []*pb.Envelope, 1)
	go func() {
		msgs, err := s.Pull(context.Background(), "box", 0, 10, 10*time.Second)
		if err != nil {
			t.Errorf("pull: %v", err)
		}
		got <- msgs
	}()
	appendN(t, s, "box", 0, 1)
	select {
	case msgs := <-got:
		if len(msgs) != 1 || msgs[0].GetMsgId() != "m0" {
			t.Fatalf("long poll got %v", ids(msgs))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long poll did not wake on append")
	}

	t.Run("timeout returns empty", func(t *testing.T) {
		start := time.Now()
		msgs, err := s.Pull(context.Background(), "box", 1, 10, 50*time.Millisecond)
		if err != nil || len(msgs) != 0 || time.Since(start) < 50*time.Millisecond {
			t.Fatalf("pull = %v, %v after %v", ids(msgs), err, time.Since(start))
		}
	})
	t.Run("context ends the poll", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if _, err := s.Pull(ctx, "box", 1, 10, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("close ends the poll", func(t *testing.T) {
		s2 := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), nil)
		_, _ = s2.Declare("box")
		errc := make(chan error, 1)
		go func() { _, err := s2.Pull(context.Background(), "box", 0, 10, time.Minute); errc <- err }()
		_ = s2.Close()
		select {
		case err := <-errc:
			if !errors.Is(err, inbox.ErrClosed) {
				t.Fatalf("err = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("close did not end the poll")
		}
	})
}

func TestLockedAndClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	s := openStore(t, path, nil)
	_, _ = s.Declare("box")
	cfg := inbox.DefaultConfig(path)
	cfg.LockTimeout = 100 * time.Millisecond
	if _, err := inbox.Open(cfg); !errors.Is(err, inbox.ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	_ = s.Close()
	if _, err := s.Append(context.Background(), "box", env("x")); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	if _, err := s.Pull(context.Background(), "box", 0, 1, 0); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("pull after close: %v", err)
	}
	if _, err := s.Declare("other"); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("declare after close: %v", err)
	}
}

func TestNamesAndConfig(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), nil)
	for _, name := range []string{"", "a@b", "a/b", "a b", "a\x00", string(make([]byte, 300)),
		".", "..", "...", "a\\b", "pay\u202Egnp.exe", "CON", "con", "Nul.txt", "COM1", "lpt9.log", "café", "a\tb"} {
		if _, err := s.Declare(name); !errors.Is(err, inbox.ErrBadName) {
			t.Errorf("Declare(%q) = %v, want ErrBadName", name, err)
		}
	}
	for _, name := range []string{"orders", "a.b", "v1:events", "a-b_c", "console", "COM", "com10", ".hidden"} {
		if err := inbox.ValidName(name); err != nil {
			t.Errorf("ValidName(%q) = %v, want ok", name, err)
		}
	}
	if _, err := s.Append(context.Background(), "undeclared", env("x")); !errors.Is(err, inbox.ErrNoSuchInbox) {
		t.Errorf("append undeclared: %v", err)
	}
	if _, err := s.Pull(context.Background(), "undeclared", 0, 1, 0); !errors.Is(err, inbox.ErrNoSuchInbox) {
		t.Errorf("pull undeclared: %v", err)
	}
	bad := []func(*inbox.Config){
		func(c *inbox.Config) { c.Path = "" },
		func(c *inbox.Config) { c.LockTimeout = 0 },
		func(c *inbox.Config) { c.MaxMessages = 0 },
		func(c *inbox.Config) { c.MaxPull = -1 },
		func(c *inbox.Config) { c.MaxWait = -1 },
		func(c *inbox.Config) { c.MaxPullBytes = 0 },
	}
	for i, mutate := range bad {
		cfg := inbox.DefaultConfig("x")
		mutate(&cfg)
		if _, err := inbox.Open(cfg); !errors.Is(err, inbox.ErrBadConfig) {
			t.Errorf("bad config %d: %v", i, err)
		}
	}
}

func TestConcurrentAppendsGetDistinctCursors(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), nil)
	_, _ = s.Declare("box")
	const n = 200
	var wg sync.WaitGroup
	curs := make([]uint64, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := s.Append(context.Background(), "box", env(fmt.Sprint(i)))
			if err != nil {
				t.Error(err)
			}
			curs[i] = c
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for _, c := range curs {
		if c == 0 || c > n || seen[c] {
			t.Fatalf("bad or duplicate cursor %d", c)
		}
		seen[c] = true
	}
	msgs, _ := s.Pull(context.Background(), "box", 0, 1000, 0)
	if len(msgs) != n {
		t.Fatalf("pulled %d, want %d", len(msgs), n)
	}
	testutil.WaitFor(t, time.Second, "stats depth", func() bool { return s.Stats()["box"].Depth == n })
}

func BenchmarkAppend(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprint("callers=", callers), func(b *testing.B) {
			s := openStore(b, filepath.Join(b.TempDir(), "inbox.db"), func(c *inbox.Config) { c.MaxMessages = 1 << 30 })
			_, _ = s.Declare("box")
			e := env("bench")
			e.Body = nil
			b.ReportAllocs()
			b.SetParallelism(max(1, callers/2)) // GOMAXPROCS is 2 here
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.Append(context.Background(), "box", e); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

func BenchmarkPull(b *testing.B) {
	s := openStore(b, filepath.Join(b.TempDir(), "inbox.db"), nil)
	_, _ = s.Declare("box")
	appendN(b, s, "box", 0, 1000)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if msgs, err := s.Pull(context.Background(), "box", 0, 100, 0); err != nil || len(msgs) != 100 {
			b.Fatal(len(msgs), err)
		}
	}
	b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "msgs/s")
}

// TestEmptiedOrDamagedInboxRefused: unacknowledged messages must not
// vanish because inbox.db was emptied, and a damaged file is refused, not
// handed to bbolt.
func TestEmptiedOrDamagedInboxRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	s := openStore(t, path, nil)
	_, _ = s.Declare("box")
	appendN(t, s, "box", 0, 50)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Every page after the metas claims to be another one.
	ps := os.Getpagesize()
	damaged := append([]byte(nil), b...)
	for p := 2; (p+1)*ps <= len(damaged); p++ {
		binary.NativeEndian.PutUint64(damaged[p*ps:], 0)
	}
	if err := os.WriteFile(path, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.Open(inbox.DefaultConfig(path)); !errors.Is(err, inbox.ErrDamaged) {
		t.Fatalf("damaged: %v, want ErrDamaged", err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.Open(inbox.DefaultConfig(path)); !errors.Is(err, inbox.ErrLost) {
		t.Fatalf("emptied: %v, want ErrLost", err)
	}
	// Another inbox's file in its place.
	other := filepath.Join(t.TempDir(), "inbox.db")
	_ = openStore(t, other, nil).Close()
	ob, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, ob, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.Open(inbox.DefaultConfig(path)); !errors.Is(err, inbox.ErrReplaced) {
		t.Fatalf("replaced: %v, want ErrReplaced", err)
	}
	// The original file back: opens with its 50 messages.
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, path, nil)
	if got := s.Stats()["box"].Depth; got != 50 {
		t.Fatalf("depth %d, want 50", got)
	}
}

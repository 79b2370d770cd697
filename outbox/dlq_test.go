package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/outbox"
)

func TestDLQListReplayPurge(t *testing.T) {
	clk := newClock()
	s, _ := openTemp(t, func(c *outbox.Config) { c.Now = clk.Now })
	enqueue(t, s, mkEnv("a@n1", "a1"), mkEnv("b@n1", "b1"), mkEnv("c@n2", "c1"))
	kill := func(r, reason string) {
		t.Helper()
		if dead, err := s.Fail(r, seqs(t, s, r, 1)[0], outbox.Failure{Reason: reason, Permanent: true}); !dead || err != nil {
			t.Fatalf("fail %s: %v %v", r, dead, err)
		}
	}
	kill("a@n1", "rejected: bad body")
	clk.Advance(time.Hour)
	kill("b@n1", "rejected: other")
	kill("c@n2", "expired")

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
			dl, err := s.DeadLetters(tt.f)
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
	all, _ := s.DeadLetters(outbox.DLQFilter{})
	if ids, _ := s.DeadLetters(outbox.DLQFilter{IDs: []string{all[2].ID}}); len(ids) != 1 || ids[0].Recipient != "c@n2" {
		t.Fatalf("by id %+v", ids)
	}

	for _, f := range []func(outbox.DLQFilter) (int, error){s.Replay, s.Purge} {
		if _, err := f(outbox.DLQFilter{}); !errors.Is(err, outbox.ErrEmptyFilter) {
			t.Fatalf("empty filter without All: %v", err)
		}
	}
	// Replay puts the message back at the tail with attempts reset.
	enqueue(t, s, mkEnv("a@n1", "a2"))
	woke := make(chan string, 4)
	s.SetOnEnqueue(func(r string) { woke <- r })
	if n, err := s.Replay(outbox.DLQFilter{Recipient: "a@n1"}); n != 1 || err != nil {
		t.Fatalf("replay %d %v", n, err)
	}
	if r := <-woke; r != "a@n1" {
		t.Fatalf("relay woken for %q", r)
	}
	msgs, _ := s.Head("a@n1", 10)
	if len(msgs) != 2 || msgs[0].GetEnvelope().GetType() != "a2" || msgs[1].GetEnvelope().GetType() != "a1" ||
		msgs[1].GetAttempts() != 0 || msgs[1].GetDeadLetterReason() != "" {
		t.Fatalf("after replay %+v", msgs)
	}
	if n, err := s.Purge(outbox.DLQFilter{Reason: "expired"}); n != 1 || err != nil {
		t.Fatalf("purge %d %v", n, err)
	}
	if n, err := s.Purge(outbox.DLQFilter{All: true}); n != 1 || err != nil {
		t.Fatalf("purge all %d %v", n, err)
	}
	if st := s.Stats(); st.DLQDepth != 0 {
		t.Fatalf("dlq depth %d", st.DLQDepth)
	}
}

func TestDedupeWindow(t *testing.T) {
	clk := newClock()
	s, _ := openTemp(t, func(c *outbox.Config) { c.Now = clk.Now; c.DedupeWindow = time.Minute })
	ctx := context.Background()
	if s.Seen("n1", "k") {
		t.Fatal("seen before record")
	}
	if err := s.Record(ctx, "n1", "k"); err != nil {
		t.Fatal(err)
	}
	if !s.Seen("n1", "k") || s.Seen("n2", "k") || s.Seen("n1", "") {
		t.Fatal("seen mismatch")
	}
	clk.Advance(2 * time.Minute)
	if s.Seen("n1", "k") {
		t.Fatal("key outlived the window")
	}
	// A later commit prunes it from memory and disk.
	if err := s.Record(ctx, "n1", "k2"); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.DedupeHits != 1 || st.DedupeKeys != 1 {
		t.Fatalf("dedupe hits %d, keys %d; want 1 and 1 (k pruned)", st.DedupeHits, st.DedupeKeys)
	}
}

// More expired keys than one commit prunes: the following commits go on
// pruning, so the window never holds more than a window's worth.
func TestDedupePrunesBacklog(t *testing.T) {
	clk := newClock()
	s, _ := openTemp(t, func(c *outbox.Config) { c.Now = clk.Now; c.DedupeWindow = time.Minute })
	ctx := context.Background()
	const n = 10000 // over twice the per-commit bound
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		s.RecordAsync("p", fmt.Sprint("k", i), func(err error) {
			if err != nil {
				t.Error(err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	clk.Advance(2 * time.Minute)
	for i := 0; i < 5; i++ { // each commit prunes a bounded share
		if err := s.Record(ctx, "p", fmt.Sprint("fresh", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Stats().DedupeKeys; got != 5 {
		t.Fatalf("dedupe keys after pruning = %d, want 5 (only the fresh ones)", got)
	}
}

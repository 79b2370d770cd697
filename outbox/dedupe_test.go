package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/outbox"
)

func TestRecordAsync(t *testing.T) {
	tests := []struct {
		name string
		keys int
	}{
		{"one", 1},
		{"group", 500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, path := openTemp(t, nil)
			done := make(chan error, tt.keys)
			for i := range tt.keys {
				k := fmt.Sprintf("k%d", i)
				s.RecordAsync("n1>a", k, func(err error) { done <- err })
				// Pending keys are duplicates at once, before the commit.
				if !s.Seen("n1>a", k) {
					t.Fatalf("key %s not seen while pending", k)
				}
			}
			for range tt.keys {
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("done: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("done never called")
				}
			}
			if s.Seen("n1>a", "other") || s.Seen("n2>a", "k0") {
				t.Fatal("unrelated key seen")
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			// Durable: a reopened store still knows every key.
			s2 := openAt(t, path, nil)
			defer s2.Close()
			for i := range tt.keys {
				if !s2.Seen("n1>a", fmt.Sprintf("k%d", i)) {
					t.Fatalf("k%d lost after reopen", i)
				}
			}
		})
	}
}

func TestRecordAsyncEdges(t *testing.T) {
	s, _ := openTemp(t, nil)
	var got []error
	s.RecordAsync("n1>a", "", func(err error) { got = append(got, err) })
	if len(got) != 1 || got[0] != nil {
		t.Fatalf("empty key: %v", got)
	}
	s.RecordAsync("n1>a", "nil-done", nil) // must not panic
	testutil.WaitFor(t, 5*time.Second, "nil-done recorded", func() bool { return s.Seen("n1>a", "nil-done") })

	s2, _ := openTemp(t, nil)
	_ = s2.Close()
	got = nil
	s2.RecordAsync("n1>a", "late", func(err error) { got = append(got, err) })
	if len(got) != 1 || !errors.Is(got[0], outbox.ErrClosed) {
		t.Fatalf("closed store: %v", got)
	}
}

// TestRecordAsyncRacesClose checks that every RecordAsync call gets its done
// exactly once even when Close runs concurrently (run with -race).
func TestRecordAsyncRacesClose(t *testing.T) {
	for round := range 20 {
		s, _ := openTemp(t, nil)
		const n = 200
		done := make(chan error, 2*n)
		start := make(chan struct{})
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			<-start
			for i := range n {
				s.RecordAsync("n1>a", fmt.Sprintf("r%d-%d", round, i), func(err error) { done <- err })
			}
		}()
		close(start)
		_ = s.Close()
		<-finished
		for range n {
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, outbox.ErrClosed) {
					t.Fatalf("done: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a done was never called")
			}
		}
		select {
		case err := <-done:
			t.Fatalf("done called twice (%v)", err)
		default:
		}
	}
}

func TestHeadSkip(t *testing.T) {
	s, _ := openTemp(t, nil)
	enqueue(t, s, mkEnv("a@n1", "m0"), mkEnv("a@n1", "m1"), mkEnv("a@n1", "m2"), mkEnv("a@n1", "m3"), mkEnv("a@n1", "m4"))
	all := seqs(t, s, "a@n1", 10)
	tests := []struct {
		name string
		skip []uint64
		n    int
		want []string
	}{
		{"none", nil, 10, []string{"m0", "m1", "m2", "m3", "m4"}},
		{"prefix", all[:2], 2, []string{"m2", "m3"}},
		{"holes", []uint64{all[1], all[3]}, 10, []string{"m0", "m2", "m4"}},
		{"unknown", []uint64{1, all[0], all[4] + 1}, 10, []string{"m1", "m2", "m3", "m4"}},
		{"everything", all, 10, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgs, err := s.HeadSkip("a@n1", tt.n, tt.skip)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range msgs {
				got = append(got, m.GetEnvelope().GetType())
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// TestCommitLingerGroupsCallers checks that the committer waits for the
// callers of its last commit, so concurrent looping callers share one fsync
// instead of alternating between two half batches (about 2 commits per
// round without linger, 1 with it).
func TestCommitLingerGroupsCallers(t *testing.T) {
	s, _ := openTemp(t, func(c *outbox.Config) { c.CommitLinger = 100 * time.Millisecond })
	const callers, rounds = 16, 20
	before := s.Stats().Fsyncs
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				if err := s.Enqueue(context.Background(), mkEnv(fmt.Sprintf("a%d@n1", c), fmt.Sprint(i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := s.Stats().Fsyncs - before; got > rounds*3/2 {
		t.Fatalf("%d commits for %d rounds of %d callers: linger did not group them", got, rounds, callers)
	}
}

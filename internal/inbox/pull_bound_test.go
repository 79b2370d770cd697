package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
)

// A program pulls with after = the cursor of the last message it got,
// as documented. Messages it got from the file must never make its next
// pull ErrPullBeyond: the cursor was handed out by Pull itself. Appends
// come one at a time (grouped with other inboxes' appends) or in batches
// (the daemon inbox actor's reliable path), one appender per inbox.
func TestPullAfterACursorItGaveIsNeverBeyond(t *testing.T) {
	for _, how := range []struct {
		name string
		add  func(s *inbox.Store, ctx context.Context, name string, i int) error
	}{
		{"append", func(s *inbox.Store, ctx context.Context, name string, i int) error {
			_, err := s.Append(ctx, name, env(fmt.Sprint("m", i)))
			return err
		}},
		{"batch", func(s *inbox.Store, ctx context.Context, name string, i int) error {
			_, _, err := s.AppendBatch(ctx, name, envs(i, 1))
			return err
		}},
	} {
		t.Run(how.name, func(t *testing.T) {
			s := openStore(t, filepath.Join(t.TempDir(), "inbox.db"), func(c *inbox.Config) { c.MaxMessages = 1 << 20 })
			const boxes = 8
			const perBox = 400
			for b := range boxes {
				if _, err := s.Declare(fmt.Sprint("box", b)); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			errc := make(chan error, 2*boxes)
			for b := range boxes {
				name := fmt.Sprint("box", b)
				wg.Go(func() { // one appender per inbox, like the inbox actor
					for i := range perBox {
						if err := how.add(s, ctx, name, i); err != nil {
							errc <- err
							return
						}
					}
				})
				wg.Go(func() { // the program: long polls from the last cursor it got
					var after uint64
					got := 0
					for got < perBox {
						msgs, err := s.Pull(ctx, name, after, 1000, 5*time.Second)
						if err != nil {
							errc <- fmt.Errorf("%s: pull after %d (had %d messages): %w", name, after, got, err)
							return
						}
						for _, m := range msgs {
							if m.GetEventSeq() != after+1 {
								errc <- fmt.Errorf("%s: cursor %d after %d", name, m.GetEventSeq(), after)
								return
							}
							after = m.GetEventSeq()
							got++
						}
					}
				})
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				if errors.Is(err, inbox.ErrPullBeyond) {
					t.Errorf("spurious ErrPullBeyond: %v", err)
				} else {
					t.Error(err)
				}
			}
		})
	}
}

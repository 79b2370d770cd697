package partition

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Sends of every kind and Replays race Close (started or not); every
// SendAsync accepted has its callback called exactly once, nothing hangs.
func TestCloseRacesSendsAndReplays(t *testing.T) {
	for _, start := range []bool{false, true} {
		for round := 0; round < 10; round++ {
			t.Run(fmt.Sprintf("start=%v/%d", start, round), func(t *testing.T) {
				d := &versionsPeer{entered: make(chan struct{}), refused: map[string]bool{}, ran: map[string][]string{}}
				r := newTestRelay(t, d)
				if start {
					r.Start()
				}
				ctx := context.Background()
				for i := 0; i < 5; i++ {
					sm := message(fmt.Sprintf("a%d@n1", i), "v1", 0)
					seq, _ := r.store.ReserveSequence()
					sm.Envelope.Sequence = seq
					if err := r.store.DeadLetter(ctx, sm, "rejected: test"); err != nil {
						t.Fatal(err)
					}
				}
				var accepted, called, twice atomic.Int64
				var wg sync.WaitGroup
				var cbs sync.WaitGroup
				for g := 0; g < 4; g++ {
					wg.Add(1)
					go func(g int) {
						defer wg.Done()
						for i := 0; i < 30; i++ {
							rcpt := fmt.Sprintf("a%d@n1", (g+i)%5)
							switch i % 4 {
							case 0:
								var once atomic.Bool
								cbs.Add(1)
								if err := r.SendAsync(ctx, message(rcpt, "m", 0), func(Sent, error) {
									called.Add(1)
									if !once.CompareAndSwap(false, true) {
										twice.Add(1)
										return
									}
									cbs.Done()
								}); err != nil {
									cbs.Done()
								} else {
									accepted.Add(1)
								}
							case 1:
								_, _ = r.Send(ctx, message(rcpt, "m", 0), true)
							case 2:
								_ = r.Store(ctx, []*pb.StoredMessage{message(rcpt, "m", 0), message("b@n1", "m", 0)})
							case 3:
								_, _ = r.store.Replay(outbox.DLQFilter{All: true})
							}
						}
					}(g)
				}
				closed := make(chan struct{})
				go func() { _ = r.Close(); _ = r.Close(); close(closed) }()
				all := make(chan struct{})
				go func() { wg.Wait(); <-closed; cbs.Wait(); close(all) }()
				select {
				case <-all:
				case <-time.After(20 * time.Second):
					t.Fatalf("hang: accepted %d SendAsync, %d callbacks", accepted.Load(), called.Load())
				}
				if twice.Load() != 0 || called.Load() != accepted.Load() {
					t.Fatalf("SendAsync: accepted %d, callbacks %d (twice %d)", accepted.Load(), called.Load(), twice.Load())
				}
			})
		}
	}
}

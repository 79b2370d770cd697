package node_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Tells of large messages from several goroutines, faster than the
// connection writes them: a send that does not fit the send queue is a
// *CapacityError whose RetryAfter is the transport's estimate of when it
// will (not a fixed guess), and senders that wait it out deliver
// everything.
func TestTellIntoFullSendQueueSaysWhenToRetry(t *testing.T) {
	const (
		size    = 200 << 10
		senders = 8
		each    = 12
	)
	nodes := clusterWith(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Transport.MaxFrameSize, cfg.Transport.SendQueueBytes = 256<<10, 512<<10
		}
	})
	done, to := counter(t, nodes[1], "sink", senders*each, senders*each)
	msg := wrapperspb.Bytes(make([]byte, size))
	var (
		mu    sync.Mutex
		hints []time.Duration
		other error
	)
	var wg sync.WaitGroup
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				for {
					err := nodes[0].Tell(context.Background(), to, msg)
					if err == nil {
						break
					}
					var ce *node.CapacityError
					mu.Lock()
					if !errors.As(err, &ce) {
						other = err
						mu.Unlock()
						return
					}
					hints = append(hints, ce.RetryAfter)
					if !strings.Contains(err.Error(), "send queue full") || strings.Contains(err.Error(), "mailbox") {
						other = fmt.Errorf("refusal %q does not say the send queue is full, or reads as a full mailbox", err.Error())
						mu.Unlock()
						return
					}
					mu.Unlock()
					time.Sleep(ce.RetryAfter) // as the error asks: what is tested
				}
			}
		}()
	}
	wg.Wait()
	if other != nil {
		t.Fatalf("Tell: %v, want nil or a *CapacityError", other)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("not every message arrived (node stats %+v)", nodes[1].Stats())
	}
	if len(hints) == 0 {
		t.Fatalf("%d Tells of %d B into a %d B queue were never refused: the test did not fill the queue", senders*each, size, 512<<10)
	}
	lo, hi := slices.Min(hints), slices.Max(hints)
	if lo < time.Millisecond || hi > time.Second {
		t.Fatalf("RetryAfter from %v to %v, want within [1ms, 1s]", lo, hi)
	}
	if lo == hi && lo == 5*time.Millisecond {
		t.Fatalf("every RetryAfter is %v: the old fixed guess, not the queue's estimate", lo)
	}
	t.Logf("%d refusals; RetryAfter from %v to %v", len(hints), lo, hi)
}

package testnet

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BenchmarkDrainOverSlowLink measures how fast a backlog reaches one
// recipient over a link with a one-way delay in each direction (sites
// joined by a WAN): b.N messages of 128 B queued while the recipient's
// node is stopped, then the rate from the first message its actor ran to
// the last. Run it with a fixed count, e.g. -benchtime 20000x. The
// recipient's mailbox holds one batch (the default, 1,024) or four.
func BenchmarkDrainOverSlowLink(b *testing.B) {
	for _, tc := range []struct {
		delay   time.Duration
		mailbox int
	}{{0, 1024}, {2 * time.Millisecond, 1024}, {10 * time.Millisecond, 1024}, {10 * time.Millisecond, 4096}} {
		name := tc.delay.String()
		if tc.mailbox != 1024 {
			name += fmt.Sprintf("/mailbox=%d", tc.mailbox)
		}
		delay := tc.delay
		b.Run(name, func(b *testing.B) {
			var ran atomic.Int64
			var first, last atomic.Int64
			all := make(chan struct{})
			c := New(b, 2, WithSpawn(func(i int, n *node.Node) error {
				if i != 1 {
					return nil
				}
				_, err := n.Spawn("sink", func(context.Context, *node.Message) (proto.Message, error) {
					now := time.Now().UnixNano()
					first.CompareAndSwap(0, now)
					last.Store(now)
					if ran.Add(1) == int64(b.N) {
						close(all)
					}
					return nil, nil
				}, node.WithMailbox(tc.mailbox, mailbox.Reject))
				return err
			}))
			if err := c.Stop(1); err != nil {
				b.Fatal(err)
			}
			if err := c.WaitDown(1, 30*time.Second); err != nil {
				b.Fatal(err)
			}
			msg := wrapperspb.Bytes(make([]byte, 128))
			queueReliable(b, c, c.Addr("sink", 1), b.N, func(int) proto.Message { return msg })
			delayBothWays(b, c, delay)
			b.ResetTimer()
			if err := c.Restart(1); err != nil {
				b.Fatal(err)
			}
			select {
			case <-all:
			case <-time.After(5 * time.Minute):
				b.Fatalf("ran %d of %d", ran.Load(), b.N)
			}
			b.StopTimer()
			if d := time.Duration(last.Load() - first.Load()); d > 0 {
				b.ReportMetric(float64(b.N-1)/d.Seconds(), "msgs/s")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

package node_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/testnet"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A reliable burst of bodies of many types (each named once per lane
// stream by the outbox's runs), with tells and asks of the same types on
// the same connection (traffic around it: their own outcomes are tested
// elsewhere) and the peer restarted midway: every reliable message runs
// once, with its own type, in the order sent; nothing is dead-lettered.
func TestReliableBurstOfManyTypes(t *testing.T) {
	const n = 600
	var mu sync.Mutex
	got := map[string]int{}
	bad, last := "", -1
	mkMsg := func(i int) proto.Message {
		switch i % 5 {
		case 0:
			return wrapperspb.String(fmt.Sprint(i))
		case 1:
			return wrapperspb.UInt64(uint64(i))
		case 2:
			return wrapperspb.Int64(int64(i))
		case 3:
			return wrapperspb.Bytes([]byte(fmt.Sprint(i)))
		default:
			return wrapperspb.Int32(int32(i))
		}
	}
	c := testnet.New(t, 2,
		testnet.WithSpawn(func(_ int, nd *node.Node) error {
			_, err := nd.Spawn("sink", func(_ context.Context, m *node.Message) (proto.Message, error) {
				b, err := m.Body()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					bad = fmt.Sprintf("%s: %v", m.ID(), err)
					return nil, nil
				}
				var v string
				switch x := b.(type) {
				case *wrapperspb.StringValue:
					v = x.Value
				case *wrapperspb.UInt64Value:
					v = fmt.Sprint(x.Value)
				case *wrapperspb.Int64Value:
					v = fmt.Sprint(x.Value)
				case *wrapperspb.BytesValue:
					v = string(x.Value)
				case *wrapperspb.Int32Value:
					v = fmt.Sprint(x.Value)
				}
				var k int
				fmt.Sscan(v, &k)
				if want := proto.MessageName(mkMsg(k)); want != proto.MessageName(b) {
					bad = fmt.Sprintf("value %d arrived as %s, sent as %s", k, proto.MessageName(b), want)
				}
				if k < n && got[v] == 0 { // a reliable message, first run
					if k < last {
						bad = fmt.Sprintf("reliable message %d ran after %d", k, last)
					}
					last = k
				}
				got[v]++
				return b, nil
			})
			return err
		}))
	ctx := ctxT(t)
	var pend []*node.Pending
	for i := range n {
		p, err := c.Node(0).TellReliableAsync(ctx, c.Addr("sink", 1), mkMsg(i))
		if err != nil {
			t.Fatal(err)
		}
		pend = append(pend, p)
		if i%50 == 0 {
			if err := c.Node(0).Tell(ctx, c.Addr("sink", 1), mkMsg(100000+i)); err != nil {
				t.Logf("tell: %v", err)
			}
			resp := mkMsg(200000 + i)
			want := proto.Clone(resp)
			if i > n/2-60 && i < n/2+60 {
				continue // around the restart
			}
			if err := c.Node(0).Ask(ctx, c.Addr("sink", 1), resp, resp); err != nil {
				t.Logf("ask: %v", err)
			} else if !proto.Equal(resp, want) {
				t.Fatalf("ask answered %v, want %v", resp, want)
			}
		}
		if i == n/2 {
			if err := c.Stop(1); err != nil {
				t.Fatal(err)
			}
			if err := c.Restart(1); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, p := range pend {
		out, err := p.Wait(ctx)
		if err != nil || (out != node.Delivered && out != node.Queued) {
			t.Fatalf("message %d: %v %v", i, out, err)
		}
	}
	if err := c.WaitDrained(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if got[fmt.Sprint(i)] != 1 {
			t.Errorf("reliable message %d ran %d times", i, got[fmt.Sprint(i)])
		}
	}
	if bad != "" {
		t.Fatal(bad)
	}
	if dead, err := c.DeadLetters(); err != nil || len(dead) > 0 {
		t.Fatalf("dead letters: %v %v", dead, err)
	}
	t.Logf("ran %d distinct", len(got))
}

package node_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestRemoteTellAndAskThreeNodes(t *testing.T) {
	nodes := cluster(t, 3)
	ctx := ctxT(t)
	var mu sync.Mutex
	got := map[string][]string{}
	for _, n := range nodes {
		n.Spawn("echo", echo)
		n.Spawn("sink", func(ctx context.Context, m *node.Message) (proto.Message, error) {
			var s wrapperspb.StringValue
			if err := m.Decode(&s); err != nil {
				return nil, err
			}
			mu.Lock()
			got[m.Recipient().Node] = append(got[m.Recipient().Node], s.GetValue())
			mu.Unlock()
			return nil, nil
		})
	}
	for i, from := range nodes {
		for j, to := range nodes {
			if i == j {
				continue
			}
			var resp wrapperspb.StringValue
			if err := from.Ask(ctx, node.Addr("echo", to.Name()), wrapperspb.String(from.Name()), &resp); err != nil {
				t.Fatalf("%s ask %s: %v", from.Name(), to.Name(), err)
			}
			if resp.GetValue() != "echo:"+from.Name() {
				t.Fatalf("%s ask %s: reply %q", from.Name(), to.Name(), resp.GetValue())
			}
			if err := from.Tell(ctx, node.Addr("sink", to.Name()), wrapperspb.String(from.Name())); err != nil {
				t.Fatalf("%s tell %s: %v", from.Name(), to.Name(), err)
			}
		}
	}
	testutil.WaitFor(t, 5*time.Second, "every node got two tells", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range nodes {
			if len(got[n.Name()]) != 2 {
				return false
			}
		}
		return true
	})
}

func TestRemoteTellOrder(t *testing.T) {
	nodes := cluster(t, 2)
	ctx := ctxT(t)
	const total = 20000
	var mu sync.Mutex
	var seen []int
	nodes[1].Spawn("ordered", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.Int64Value
		if err := m.Decode(&v); err != nil {
			return nil, err
		}
		mu.Lock()
		seen = append(seen, int(v.GetValue()))
		mu.Unlock()
		return nil, nil
	}, node.WithMailbox(total, mailbox.Reject))
	to := node.Addr("ordered", nodes[1].Name())
	for i := 0; i < total; i++ {
		err := nodes[0].Tell(ctx, to, wrapperspb.Int64(int64(i)))
		var ce *node.CapacityError
		for errors.As(err, &ce) { // the connection queue is bounded: back off as told
			time.Sleep(ce.RetryAfter) // the sender's behaviour under test, not a wait for a state
			err = nodes[0].Tell(ctx, to, wrapperspb.Int64(int64(i)))
		}
		if err != nil {
			t.Fatalf("tell %d: %v", i, err)
		}
	}
	testutil.WaitFor(t, 20*time.Second, "all tells arrived", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == total
	})
	for i, v := range seen {
		if v != i {
			t.Fatalf("message %d arrived at position %d: order broken", v, i)
		}
	}
}

func TestRemoteAskErrors(t *testing.T) {
	nodes := cluster(t, 2)
	ctx := ctxT(t)
	errBoom := errors.New("boom")
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{}, 1)
	nodes[1].Spawn("fail", func(ctx context.Context, m *node.Message) (proto.Message, error) { return nil, errBoom })
	nodes[1].Spawn("slow", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, nil
	}, node.WithMailbox(1, mailbox.Reject))
	peer := nodes[1].Name()

	var re *node.RemoteError
	if err := nodes[0].Ask(ctx, node.Addr("fail", peer), wrapperspb.String("x"), nil); !errors.As(err, &re) || re.Message != errBoom.Error() {
		t.Fatalf("remote handler error = %v, want *RemoteError(boom)", err)
	}
	if err := nodes[0].Ask(ctx, node.Addr("ghost", peer), wrapperspb.String("x"), nil); !errors.Is(err, node.ErrNoSuchActor) {
		t.Fatalf("remote missing actor = %v, want ErrNoSuchActor", err)
	}
	// Fill the slow actor: one in its handler, one in its mailbox of 1.
	if err := nodes[0].Tell(ctx, node.Addr("slow", peer), wrapperspb.String("a")); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := nodes[0].Tell(ctx, node.Addr("slow", peer), wrapperspb.String("b")); err != nil {
		t.Fatal(err)
	}
	var ce *node.CapacityError
	testutil.WaitFor(t, 5*time.Second, "remote full gives CapacityError", func() bool {
		err := nodes[0].Ask(ctx, node.Addr("slow", peer), wrapperspb.String("c"), nil)
		return errors.As(err, &ce) && errors.Is(err, node.ErrMailboxFull) && ce.RetryAfter > 0
	})
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	nodes[1].Spawn("mute", func(ctx context.Context, m *node.Message) (proto.Message, error) { <-release; return nil, nil })
	if err := nodes[0].Ask(short, node.Addr("mute", peer), wrapperspb.String("x"), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ask past deadline = %v, want DeadlineExceeded", err)
	}
}

func TestRemoteUnreachableAfterKill(t *testing.T) {
	nodes := cluster(t, 3)
	ctx := ctxT(t)
	victim := nodes[2]
	inHandler := make(chan struct{}, 1)
	victim.Spawn("mute", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		inHandler <- struct{}{}
		<-ctx.Done()
		return nil, nil
	})
	askErr := make(chan error, 1)
	go func() {
		long, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		askErr <- nodes[0].Ask(long, node.Addr("mute", victim.Name()), wrapperspb.String("x"), nil)
	}()
	<-inHandler // the ask is registered and in the victim's handler
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "victim declared dead", func() bool {
		m := memberState(nodes[0], victim.Name())
		return m == "dead" || m == "left"
	})
	start := time.Now()
	err := nodes[0].Tell(ctx, node.Addr("mute", victim.Name()), wrapperspb.String("x"))
	if !errors.Is(err, node.ErrUnreachable) {
		t.Fatalf("tell to dead peer = %v, want ErrUnreachable", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("tell to dead peer took %v: it must not dial", d)
	}
	select {
	case err := <-askErr:
		if !errors.Is(err, node.ErrUnreachable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("in-flight ask = %v", err)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("in-flight ask waited for its deadline; want ErrUnreachable when the peer died")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("in-flight ask to a dead peer did not fail")
	}
}

func memberState(n *node.Node, name string) string {
	for _, m := range n.Members() {
		if m.Name == name {
			return m.State.String()
		}
	}
	return "unknown"
}

var _ = fmt.Sprint

// TestAsksAtTheirDeadlineGetOnlyTheirOwnReply: asks whose responses
// arrive around their deadline, many at once; each ask that succeeds gets
// its own reply, and each that fails fails by its deadline (an asker's
// response channel is reused only once its response was received).
func TestAsksAtTheirDeadlineGetOnlyTheirOwnReply(t *testing.T) {
	nodes := cluster(t, 2)
	ctx := ctxT(t)
	nodes[1].Spawn("late", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var s wrapperspb.StringValue
		if err := m.Decode(&s); err != nil {
			return nil, err
		}
		time.Sleep(time.Duration(len(s.GetValue())%3) * 300 * time.Microsecond) // the handler's work
		return wrapperspb.String("re:" + s.GetValue()), nil
	}, node.WithMailbox(4096, mailbox.Reject))
	to := node.Addr("late", nodes[1].Name())
	// The deadlines spread around the round trip's time on this machine.
	var resp wrapperspb.StringValue
	var rtt time.Duration
	for range 20 {
		start := time.Now()
		if err := nodes[0].Ask(ctx, to, wrapperspb.String("warm-up"), &resp); err != nil {
			t.Fatal(err)
		}
		rtt += time.Since(start) / 20
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, late int
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			var resp wrapperspb.StringValue
			for i := range 250 {
				q := fmt.Sprintf("%d-%d%s", g, i, strings.Repeat("x", i%3))
				short, cancel := context.WithTimeout(ctx, rtt/2+time.Duration(i%7)*rtt/3)
				err := nodes[0].Ask(short, to, wrapperspb.String(q), &resp)
				cancel()
				mu.Lock()
				switch {
				case err == nil && resp.GetValue() != "re:"+q:
					errs <- fmt.Errorf("ask %q got %q", q, resp.GetValue())
				case err == nil:
					ok++
				case errors.Is(err, context.DeadlineExceeded):
					late++
				default:
					errs <- fmt.Errorf("ask %q: %w", q, err)
				}
				mu.Unlock()
				if len(errs) > 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d answered, %d past their deadline", ok, late)
}

// mixedReply is what the "mix" actor answers to q: a reply of a kind
// and size, an error, a capacity error, nothing, or an empty body.
func mixedReply(q string) (proto.Message, error) {
	kind, arg, _ := strings.Cut(q, ":")
	switch kind {
	case "s": // a string of a size
		n, _ := strconv.Atoi(arg[:strings.IndexByte(arg, '/')])
		return wrapperspb.String(strings.Repeat(string(rune('a'+len(q)%26)), n) + "|" + q), nil
	case "i":
		v, _ := strconv.ParseInt(arg[:strings.IndexByte(arg, '/')], 10, 64)
		return wrapperspb.Int64(v), nil
	case "e":
		return nil, errors.New("handler failed for " + q)
	case "c":
		return nil, &node.CapacityError{RetryAfter: 1234 * time.Millisecond}
	case "n":
		return nil, nil
	case "b": // an empty body
		return wrapperspb.String(""), nil
	}
	return nil, fmt.Errorf("unknown %q", q)
}

// TestPooledResponsesOfEveryKindAlternate: replies of different types and
// sizes (empty, small, over the pooled body bound), handler errors with and
// without a retry-after, and nil replies alternate through the pooled
// response envelope while tells with headers go the other way through the
// same pool; every asker gets exactly its own outcome.
func TestPooledResponsesOfEveryKindAlternate(t *testing.T) {
	nodes := cluster(t, 2)
	ctx := ctxT(t)
	for _, n := range nodes {
		if _, err := n.Spawn("mix", func(ctx context.Context, m *node.Message) (proto.Message, error) {
			var s wrapperspb.StringValue
			if err := m.Decode(&s); err != nil {
				return nil, err
			}
			return mixedReply(s.GetValue())
		}, node.WithMailbox(8192, mailbox.Reject)); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Spawn("sink", func(ctx context.Context, m *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
	kinds := []string{"s:%d/", "i:%d/", "e:", "c:", "n:", "b:", "s:%d/"}
	sizes := []int{0, 1, 100, 70 << 10, 3, 5000}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 16 {
		from, to := nodes[g%2], nodes[1-g%2]
		addr := node.Addr("mix", to.Name())
		wg.Go(func() {
			for i := range 150 {
				if g%4 == 3 {
					_ = from.Tell(ctx, node.Addr("sink", to.Name()), wrapperspb.String("t"), node.WithHeaders(map[string]string{"x-a": "1", "x-b": "2"}))
				}
				k := kinds[(i+g)%len(kinds)]
				var q string
				if strings.Contains(k, "%d") {
					q = fmt.Sprintf(k, sizes[(i*7+g)%len(sizes)])
				} else {
					q = k
				}
				q += fmt.Sprintf("g%d-i%d", g, i)
				wantMsg, wantErr := mixedReply(q)
				var err error
				var gotS wrapperspb.StringValue
				var gotI wrapperspb.Int64Value
				switch wantMsg.(type) {
				case *wrapperspb.Int64Value:
					err = from.Ask(ctx, addr, wrapperspb.String(q), &gotI)
				case nil:
					err = from.Ask(ctx, addr, wrapperspb.String(q), nil)
				default:
					err = from.Ask(ctx, addr, wrapperspb.String(q), &gotS)
				}
				var bad error
				switch {
				case wantErr != nil:
					var ce *node.CapacityError
					var re *node.RemoteError
					if k == "c:" {
						if !errors.As(err, &ce) || ce.RetryAfter != 1234*time.Millisecond {
							bad = fmt.Errorf("ask %q: %w, want a capacity error with retry 1.234s", q, err)
						}
					} else if errors.As(err, &ce) || !errors.As(err, &re) || !strings.Contains(re.Message, q) {
						bad = fmt.Errorf("ask %q: %w, want a remote error naming it", q, err)
					}
				case err != nil:
					bad = fmt.Errorf("ask %q: %w", q, err)
				case wantMsg == nil:
				default:
					var got proto.Message = &gotS
					if _, ok := wantMsg.(*wrapperspb.Int64Value); ok {
						got = &gotI
					}
					if !proto.Equal(got, wantMsg) {
						bad = fmt.Errorf("ask %q got a different reply (%d bytes)", q, proto.Size(got))
					}
				}
				if bad != nil {
					errs <- bad
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestBothSidesAskingAtOnceLoseNoAsk: two nodes with no connection yet ask
// each other at once from many goroutines; every ask is answered (none
// waits out its deadline because its request went out on a connection
// the simultaneous-dial tie-break then closed).
func TestBothSidesAskingAtOnceLoseNoAsk(t *testing.T) {
	nodes := cluster(t, 2)
	for _, n := range nodes {
		if _, err := n.Spawn("echo", echo); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		from, to := nodes[g%2], nodes[1-g%2]
		wg.Go(func() {
			var resp wrapperspb.StringValue
			for i := range 20 {
				if err := from.Ask(ctx, node.Addr("echo", to.Name()), wrapperspb.String(from.Name()), &resp); err != nil {
					errs <- fmt.Errorf("asker %d, ask %d, %s -> %s: %w", g, i, from.Name(), to.Name(), err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestResponsesWaitForRoomInAFullSendQueue: large replies to many askers
// through a small send queue. A response that finds the responder's queue
// to the asker full waits for room (up to the ask's deadline) instead of
// being dropped: no ask waits out its deadline; what fails, fails at once
// with a retry hint (the asker's own queue full).
func TestResponsesWaitForRoomInAFullSendQueue(t *testing.T) {
	nodes := clusterWith(t, 2, func(i int, cfg *node.Config) {
		cfg.Transport.SendQueueSize = 4
		cfg.AskTimeout = 3 * time.Second
	})
	big := wrapperspb.String(strings.Repeat("x", 200<<10))
	if _, err := nodes[1].Spawn("big", func(ctx context.Context, m *node.Message) (proto.Message, error) { return big, nil }, node.WithMailbox(4096, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	to := node.Addr("big", nodes[1].Name())
	var wg sync.WaitGroup
	var answered atomic.Int64
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			var r wrapperspb.StringValue
			for range 10 {
				err := nodes[0].Ask(context.Background(), to, wrapperspb.String("q"), &r)
				var ce *node.CapacityError
				switch {
				case err == nil:
					answered.Add(1)
				case errors.As(err, &ce):
				default:
					errs <- err // a lost response ends in DeadlineExceeded
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if answered.Load() == 0 {
		t.Fatal("no ask was answered")
	}
}

package node_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// flakyHandler is a handler and a BatchHandler that fails at random
// (transiently or for capacity) and counts each value's successful runs.
type flakyHandler struct {
	mu   sync.Mutex
	rng  *rand.Rand
	runs map[string]int
	fail float64
}

func (f *flakyHandler) one(v string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r := f.rng.Float64(); {
	case r < f.fail/2:
		return errors.New("flaky")
	case r < f.fail:
		return &node.CapacityError{RetryAfter: time.Millisecond}
	}
	f.runs[v]++
	return nil
}

func (f *flakyHandler) handler(_ context.Context, m *node.Message) (proto.Message, error) {
	var v wrapperspb.StringValue
	if err := m.Decode(&v); err != nil {
		return nil, err
	}
	return nil, f.one(v.GetValue())
}

func (f *flakyHandler) batch(_ context.Context, msgs []*node.Message) (int, error) {
	for i, m := range msgs {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return i, err
		}
		if err := f.one(v.GetValue()); err != nil {
			return i, err
		}
	}
	return len(msgs), nil
}

// streamValueEnv is message seq of stream epoch to sink@n1 carrying v.
func streamValueEnv(tb testing.TB, epoch, seq, prev uint64, v, id string) *pb.Envelope {
	env := streamEnv("sink", "n1", seq, prev)
	env.MsgId, env.CreatedAtUnixMs, env.StreamEpoch = id, 1000, epoch
	body, err := anypb.New(wrapperspb.String(v))
	if err != nil {
		tb.Fatal(err)
	}
	env.Body = body
	return env
}

// A healthy sender (no restore) of several streams, sharing one
// sequence, meets a small Reject or DropOldest mailbox, a flaky handler
// (single or batch, failing transiently or for capacity), copies sent
// twice and the stream cache emptied all the while: many messages are
// refused or answered without their effect and kept to compare. What
// must hold: no message is answered DIVERGED, and each runs exactly once.
func TestHealthyStreamsRefusedAndFailingNeverDiverge(t *testing.T) {
	for _, tc := range []struct {
		name     string
		batch    bool
		overflow mailbox.Overflow
		keys     bool
	}{
		{"single dropoldest", false, mailbox.DropOldest, false},
		{"batch dropoldest", true, mailbox.DropOldest, false},
		{"single reject", false, mailbox.Reject, false},
		{"batch reject", true, mailbox.Reject, false},
		{"single dropoldest keys", false, mailbox.DropOldest, true},
		{"batch dropoldest keys", true, mailbox.DropOldest, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const streams, msgs, window = 4, 60, 12
			n := newNode(t, "n1", t.TempDir(), func(c *node.Config) {})
			f := &flakyHandler{rng: rand.New(rand.NewPCG(1, 2)), runs: map[string]int{}, fail: 0.3}
			opts := []node.SpawnOption{node.WithMailbox(4, tc.overflow)}
			if tc.batch {
				opts = append(opts, node.WithBatch(f.batch, 8))
			}
			if _, err := n.Spawn("sink", f.handler, opts...); err != nil {
				t.Fatal(err)
			}
			var emu sync.Mutex
			var errs []string
			var wg sync.WaitGroup
			stop := make(chan struct{})
			evicted := make(chan struct{})
			go func() {
				defer close(evicted)
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Millisecond):
						n.EvictIdleStreams(0)
					}
				}
			}()
			for s := uint64(1); s <= streams; s++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(s, 7))
					seqOf := func(i int) uint64 { return uint64(i)*streams + s } // global sequences
					acked, attempt := 0, 0
					deadline := time.Now().Add(60 * time.Second)
					for acked < msgs && time.Now().Before(deadline) {
						end := min(acked+window, msgs)
						type res struct {
							i  int
							rc *pb.Receipt
						}
						ch := make(chan res, 4*window)
						sent := 0
						for i := acked; i < end; i++ {
							prev := uint64(0)
							if i > acked {
								prev = seqOf(i - 1)
							} else if i > 0 && rng.IntN(2) == 0 {
								prev = seqOf(i - 1)
							}
							copies := 1
							if rng.IntN(4) == 0 {
								copies = 2
							}
							for range copies {
								attempt++
								id := fmt.Sprintf("s%d-m%d-a%d", s, i, attempt)
								env := streamValueEnv(t, s, seqOf(i), prev, fmt.Sprintf("s%d-m%d", s, i), id)
								if tc.keys {
									env.IdempotencyKey = fmt.Sprintf("k-s%d-m%d", s, i)
								}
								i := i
								sent++
								n.DeliverIncoming(peerP, env, func(rc *pb.Receipt) { ch <- res{i, rc} })
							}
						}
						newAcked := acked
						for range sent {
							select {
							case r := <-ch:
								switch r.rc.GetCode() {
								case pb.Receipt_PROCESSED, pb.Receipt_DUPLICATE:
									newAcked = max(newAcked, r.i+1)
								case pb.Receipt_DIVERGED, pb.Receipt_REJECTED, pb.Receipt_FORGOTTEN:
									emu.Lock()
									errs = append(errs, fmt.Sprintf("stream %d message %d answered %v: %s", s, r.i, r.rc.GetCode(), r.rc.GetMessage()))
									emu.Unlock()
									return // the stream cannot go on (the other receipts have room in ch)
								}
							case <-time.After(20 * time.Second):
								emu.Lock()
								errs = append(errs, fmt.Sprintf("stream %d: a receipt never came", s))
								emu.Unlock()
								return
							}
						}
						acked = newAcked
						if acked < msgs {
							time.Sleep(time.Millisecond) // a sender's backoff, not a wait for a state
						}
					}
					if acked < msgs {
						emu.Lock()
						errs = append(errs, fmt.Sprintf("stream %d: only %d of %d acked", s, acked, msgs))
						emu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(stop)
			<-evicted
			for _, e := range errs {
				t.Error(e)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for s := 1; s <= streams; s++ {
				for i := range msgs {
					if k := f.runs[fmt.Sprintf("s%d-m%d", s, i)]; k != 1 {
						t.Errorf("s%d-m%d ran %d times", s, i, k)
					}
				}
			}
		})
	}
}

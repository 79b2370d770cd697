package node_test

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
)

// Values from the wire or the config that overflow an int (32 bits on
// some platforms) or an int64 once scaled to nanoseconds.

// A peer's ttl_ms is taken as it came (only a negative one is refused) and
// turned into the batch's context in nanoseconds: earliest-now (ms) times
// time.Millisecond wraps past ~292 years. A TTL of 2^58 ms makes the
// product exactly 2^64 (so 0), minus whatever elapsed since the arrival:
// the batch's context is over before its handler runs. The message
// without a TTL from another sender (m2, from p) that shares the batch
// with q's is then failed by its handler (a commit that honours ctx) and
// answered TRANSIENT: an attempt counted against a healthy message, which
// the 'short TTL runs alone' rule (batch.go) exists to prevent. One such
// frame per batch from any member; MaxAttempts of them dead-letter m2.
// A received TTL is now held to a century.
func TestHugeTTLDoesNotEndItsBatchsDeadline(t *testing.T) {
	rs := batchBehindAnotherSendersTTL(t, 50*time.Millisecond, 1<<58) // "never expires", as far as the peer says
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, id := range []string{"m2", "q1"} {
		if rc := rs.got[id]; rc.GetCode() != pb.Receipt_PROCESSED {
			t.Errorf("%s answered %v %q: the batch's deadline, q1's TTL of 2^58 ms in ns, wrapped into the past", id, rc.GetCode(), rc.GetMessage())
		}
	}
}

// The same TTL on a reliable message handled alone: its handler's
// context is over before it starts (runStream: HandlerTimeout is cut to
// the wrapped TTL), so a message that says it never expires is failed
// TRANSIENT on every delivery until MaxAttempts dead-letters it at its
// sender.
func TestHugeTTLDoesNotEndItsHandlersDeadline(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	if _, err := n.Spawn("a", func(ctx context.Context, _ *node.Message) (proto.Message, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
			return nil, nil
		}
	}); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	env := streamEnv("a", "n1", 1, 0)
	env.TtlMs = 1 << 58
	rc := rs.deliverWait(t, n, env)
	if rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("a message with a TTL of 2^58 ms answered %v %q: its handler's deadline wrapped into the past", rc.GetCode(), rc.GetMessage())
	}
}

// A receiver configured without a practical per-peer bound
// (PeerQueuedBytes = math.MaxInt64, the usual "unbounded") tells every
// sender its mailbox has no room: peerRoom computes
// int(MaxInt64/size), which on a 32-bit int keeps the low 32 bits
// (0xFFFFFFFF for a 1024-byte message: -1); the receipt clamps the
// negative room to 0, and the relay of every sender then sends one
// message per emission (partition.stream.room) and nothing early. An
// empty mailbox of 1024 places must say room (a 32-bit platform's test:
// 64 bits hold the quotient).
func TestUnboundedPeerBytesStillSayRoom(t *testing.T) {
	n := startNodeWith(t, "n1", t.TempDir(), func(c *node.Config) { c.PeerQueuedBytes = math.MaxInt64 })
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	env := streamEnv("a", "n1", 1, 0)
	// Pad the message to 1024 bytes as the node counts them.
	env.Type = strings.Repeat("t", int(1024-node.EnvBytes(env)))
	if s := node.EnvBytes(env); s != 1024 {
		t.Fatalf("envelope of %d bytes, want 1024", s)
	}
	var rs receipts
	rc := rs.deliverWait(t, n, env)
	if rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("receipt %v %q", rc.GetCode(), rc.GetMessage())
	}
	if rc.GetRoom() == 0 {
		t.Fatalf("receipt says room 0 (arrived %d) from an idle actor whose node bounds no peer's bytes: int(MaxInt64/1024) wrapped negative", rc.GetArrived())
	}
}

// Message.Attempt is a uint32 from the wire: a peer's attempt of 2^31 or
// more was negative where an int has 32 bits, and a handler that gives up
// past N attempts ("if m.Attempt() > 5") never did there. It is now the
// most an int holds (a 32-bit platform's test).
func TestAttemptPastAnIntIsTheMostOne(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	var got atomic.Int64
	if _, err := n.Spawn("a", func(_ context.Context, m *node.Message) (proto.Message, error) {
		got.Store(int64(m.Attempt()))
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	env := streamEnv("a", "n1", 1, 0)
	env.Attempt = 1 << 31
	var rs receipts
	if rc := rs.deliverWait(t, n, env); rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("receipt %v", rc.GetCode())
	}
	if a, want := got.Load(), int64(min(uint64(1)<<31, math.MaxInt)); a != want {
		t.Fatalf("Message.Attempt() = %d for a message whose attempt is 2^31, want %d", a, want)
	}
}

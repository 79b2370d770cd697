package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// RetryAfter is what a sender to a full inbox (or one whose disk refused
// the write) is told to wait.
const RetryAfter = time.Second

// ActorBatch is the most reliable messages an inbox actor stores in one
// commit: its mailbox holds 1024, and at 128 B a message 1024 make one
// commit of ~300 KB, still a few milliseconds of disk time.
const ActorBatch = 1024

// envelopeOf is what the inbox stores for m: its envelope with the
// sender TLS verified and, for a local send, the body encoded.
func envelopeOf(name string, m *node.Message) (*pb.Envelope, error) {
	env := m.Envelope()
	if s := m.Sender().String(); env.GetSender() != s {
		// The node that TLS verified, never the envelope's word (the
		// node refuses a mismatch; this keeps the file honest anyway).
		env = proto.CloneOf(env)
		env.Sender = s
	}
	if env.GetBody() == nil {
		// Local sends carry the value, not the wire bytes.
		if body, err := m.Body(); err == nil && body != nil {
			a, err := anypb.New(body)
			if err != nil {
				return nil, node.Permanent(fmt.Errorf("inbox %s: encode body: %w", name, err))
			}
			env = proto.CloneOf(env)
			env.Body = a
		}
	}
	return env, nil
}

// Handler appends every message durably before returning, so a reliable
// sender is told Delivered only once the message is on disk. An ask gets
// {"inbox": name, "cursor": N}.
func Handler(st *Store, name string) node.Handler {
	return func(ctx context.Context, m *node.Message) (proto.Message, error) {
		env, err := envelopeOf(name, m)
		if err != nil {
			return nil, err
		}
		cur, err := st.AppendMarked(ctx, name, env, markOf(m))
		if err != nil {
			return nil, backOff(err)
		}
		return &structpb.Struct{Fields: map[string]*structpb.Value{
			"inbox":  structpb.NewStringValue(name),
			"cursor": structpb.NewNumberValue(float64(cur)),
		}}, nil
	}
}

// BatchHandler stores the reliable messages waiting in an inbox
// actor's mailbox in one commit (one fsync for all, instead of one each):
// each is durable before its sender is told it was processed.
func BatchHandler(st *Store, name string) node.BatchHandler {
	return func(ctx context.Context, msgs []*node.Message) (int, error) {
		envs := make([]*pb.Envelope, len(msgs))
		marks := make([]Mark, len(msgs))
		for i, m := range msgs {
			env, err := envelopeOf(name, m)
			if err != nil {
				// Store the ones before it; it fails alone.
				n, aerr := appendBatch(ctx, st, name, envs[:i], marks[:i])
				if aerr != nil || n < i {
					return n, aerr
				}
				return i, err
			}
			envs[i], marks[i] = env, markOf(m)
		}
		return appendBatch(ctx, st, name, envs, marks)
	}
}

func appendBatch(ctx context.Context, st *Store, name string, envs []*pb.Envelope, marks []Mark) (int, error) {
	_, n, err := st.AppendBatchMarked(ctx, name, envs, marks)
	return n, backOff(err)
}

// SpawnOptions are the options an inbox actor is spawned with beside its
// Handler: its reliable messages stored in batches (BatchHandler), and what
// it stored reported to its senders (Applied).
func SpawnOptions(st *Store, name string) []node.SpawnOption {
	return []node.SpawnOption{node.WithBatch(BatchHandler(st, name), ActorBatch), node.WithApplied(Applied(st))}
}

// Applied is the inbox actor's node.WithApplied: the highest sequence of
// a stream the inbox stored, which the node's watermark may lack after a
// crash.
func Applied(st *Store) func(node.StreamID) uint64 {
	return func(s node.StreamID) uint64 {
		return st.Applied(outbox.StreamKey(s.Node, s.Outbox, s.Epoch, s.Actor))
	}
}

// markOf places m in its reliable stream (a zero Mark for tell and ask),
// so that a copy redelivered after a crash is not stored twice.
func markOf(m *node.Message) Mark {
	s := m.Stream()
	if s == (node.StreamID{}) {
		return Mark{}
	}
	return Mark{Stream: outbox.StreamKey(s.Node, s.Outbox, s.Epoch, s.Actor), Seq: m.Sequence()}
}

// backOff makes an inbox that cannot take more for now (full, or its disk
// refused the write) a *node.CapacityError: its sender waits and sends
// again without counting an attempt, as it would for a full mailbox. A
// counted failure would dead-letter healthy messages while the program
// is slow or the disk is full.
func backOff(err error) error {
	if errors.Is(err, ErrFull) || errors.Is(err, ErrWrite) {
		return fmt.Errorf("%w: %w", err, &node.CapacityError{RetryAfter: RetryAfter})
	}
	return err
}

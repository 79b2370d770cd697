package node

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
)

// Every cached stream is one inStream: at 80 bytes it is allocated from
// the 80-byte size class; one more field moves it to 96 (16 bytes more for
// each of a receiver's streams; BenchmarkReceiverStreamState measures the
// total).
func TestInStreamFitsEightyBytes(t *testing.T) {
	if got := unsafe.Sizeof(inStream{}); got > 80 {
		t.Fatalf("inStream is %d bytes, want at most 80", got)
	}
}

func TestElapsedSeconds(t *testing.T) {
	for _, tc := range []struct {
		ms   int64
		want int32
	}{{-5, 0}, {0, 0}, {999, 0}, {1000, 1}, {1 << 62, 1<<31 - 1}} {
		if got := elapsedSeconds(tc.ms); got != tc.want {
			t.Errorf("elapsedSeconds(%d) = %d, want %d", tc.ms, got, tc.want)
		}
	}
}

// A node stops its actors, then settles the inbound commits, then closes
// the store. Every commit handed to the store must be counted from the
// hand-off until its callback has answered its waiters (and started the
// next commit of its stream): otherwise settle returns while a commit is
// still under way and the next one of its chain is started on the
// committer's goroutine after settle's Wait, a race the race detector
// reports, with waiters answered only by the closed store's error.
func TestSettleWaitsForEveryCommit(t *testing.T) {
	s, err := outbox.Open(outbox.DefaultConfig(filepath.Join(t.TempDir(), "outbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := newInbound(s)
	const streams, perStream = 8, 200
	var answered, failed atomic.Int64
	var owners sync.WaitGroup
	for i := range streams {
		st, err := in.acquire(StreamID{Node: "p", Outbox: [16]byte{'p', byte(i)}, Actor: "a"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		owners.Go(func() { // the stream's owner: one goroutine moves w
			defer in.release(st)
			for seq := uint64(1); seq <= perStream; seq++ {
				in.advance(st, seq, seq, nil, func(err error, _ uint64) {
					if err != nil {
						failed.Add(1)
					}
					answered.Add(1)
				})
			}
		})
	}
	owners.Wait() // the actors have stopped
	in.settle()
	if got := answered.Load(); got != streams*perStream {
		t.Fatalf("settle returned with %d of %d waiters answered: commits were still under way", got, streams*perStream)
	}
	if f := failed.Load(); f != 0 {
		t.Fatalf("%d waiters answered with an error by an open store", f)
	}
}

// A full send queue's refusal reaches the relay as congestion carrying the
// transport's estimate, with the transport's error still in the chain.
func TestCongestedCarriesTheQueuesEstimate(t *testing.T) {
	qf := &transport.QueueFullError{Peer: "n2", RetryAfter: 3 * time.Millisecond}
	err := congested(fmt.Errorf("via n3: %w", qf))
	var ce *partition.CongestedError
	if !errors.As(err, &ce) || ce.RetryAfter != 3*time.Millisecond {
		t.Fatalf("%v: want a CongestedError with RetryAfter 3ms", err)
	}
	if !errors.Is(err, partition.ErrCongested) || !errors.Is(err, transport.ErrQueueFull) {
		t.Fatalf("%v: want both ErrCongested and ErrQueueFull in the chain", err)
	}
}

// A message at the watermark refused for room may mark the stream
// divergent (divergentAtRoom, on the goroutine that received it) while
// the owner runs a message it decided before the mark. The owner's move
// of the watermark keeps the mark, and the commit after it records the
// mark: nothing more of the stream runs, whatever ran meanwhile.
func TestOwnersMoveKeepsAMarkSetMeanwhile(t *testing.T) {
	s, err := outbox.Open(outbox.DefaultConfig(filepath.Join(t.TempDir(), "outbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := newInbound(s)
	id := StreamID{Node: "p", Outbox: [16]byte{'p'}, Actor: "a"}
	st, err := in.acquire(id, nil)
	if err != nil {
		t.Fatal(err)
	}
	env := func(seq uint64, v string) *pb.Envelope {
		return &pb.Envelope{Sequence: seq, CreatedAtUnixMs: 1000, Body: &anypb.Any{TypeUrl: "t", Value: []byte(v)}}
	}
	done := make(chan error, 2)
	in.advance(st, 1, pb.StreamDigest(env(1, "a")), nil, func(err error, _ uint64) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The owner has decided message 2 and runs it; meanwhile another
	// message under 1 is refused for room.
	if in.divergentAtRoom(st, "p", env(1, "a")) {
		t.Fatal("a copy of the message at the watermark taken for another history")
	}
	if !in.divergentAtRoom(st, "p", env(1, "b")) {
		t.Fatal("another message at the watermark not found divergent")
	}
	in.advance(st, 2, pb.StreamDigest(env(2, "c")), nil, func(err error, _ uint64) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st.digest() != divergedMark {
		t.Fatal("the owner's move of the watermark dropped the mark")
	}
	if !in.divergent(st, env(3, "d")) {
		t.Fatal("the next message of the stream runs after the mark")
	}
	in.release(st)
	in.settle()
	rec, err := s.StreamRecord(id.key())
	if err != nil {
		t.Fatal(err)
	}
	if rec.Watermark != 2 || rec.Digest != divergedMark {
		t.Fatalf("on disk: watermark %d, digest %#x; want 2 and the mark", rec.Watermark, rec.Digest)
	}
}

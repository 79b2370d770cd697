package inbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
)

// Many goroutines append marked stream messages to many inboxes through
// the grouped path, with copies (the same sequence again, an older one),
// unencodable messages, acks, declares, ForgetStreams and a full disk
// (FailCommits) interleaved. Every stream is stored once per sequence, in
// order, each copy answered with its original's cursor, and the in-memory
// Stats match the file.
func TestGroupedAppendsUnderLoadStoreEachSequenceOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	cfg := DefaultConfig(path)
	cfg.MaxMessages = 1 << 20
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	const boxes, streamsPerBox, perStream = 6, 6, 60
	for b := range boxes {
		if _, err := s.Declare(fmt.Sprint("box", b)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	var stop atomic.Bool
	var wg, bg sync.WaitGroup
	errc := make(chan error, 1000)
	report := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	// cursors[box][stream][seq] = cursor
	type key struct {
		box, stream int
		seq         uint64
	}
	var cmu sync.Mutex
	cursors := map[key]uint64{}
	for b := range boxes {
		name := fmt.Sprint("box", b)
		for st := range streamsPerBox {
			stream := []byte(fmt.Sprintf("b%d-s%d", b, st))
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(b), uint64(st)))
				for seq := uint64(1); seq <= perStream; seq++ {
					var cur uint64
					for {
						c, err := s.AppendMarked(ctx, name, &pb.Envelope{MsgId: fmt.Sprintf("%s/%d", stream, seq)}, Mark{Stream: stream, Seq: seq})
						if err == nil {
							cur = c
							break
						}
						if !errors.Is(err, ErrWrite) {
							report(fmt.Errorf("%s seq %d: %w", stream, seq, err))
							return
						}
					}
					if cur == 0 {
						report(fmt.Errorf("%s seq %d: cursor 0 for a fresh message", stream, seq))
						return
					}
					cmu.Lock()
					cursors[key{b, st, seq}] = cur
					cmu.Unlock()
					switch r.IntN(4) {
					case 0: // the same copy again
						c, err := s.AppendMarked(ctx, name, &pb.Envelope{MsgId: "copy"}, Mark{Stream: stream, Seq: seq})
						if err == nil && c != cur {
							report(fmt.Errorf("%s seq %d: copy got cursor %d, original %d", stream, seq, c, cur))
						}
					case 1: // an older copy
						if seq > 1 {
							c, err := s.AppendMarked(ctx, name, &pb.Envelope{MsgId: "old"}, Mark{Stream: stream, Seq: seq - 1})
							if err == nil && c != 0 {
								report(fmt.Errorf("%s seq %d: older copy got cursor %d", stream, seq-1, c))
							}
						}
					case 2: // a message that cannot be encoded, in the same group
						if _, err := s.AppendMarked(ctx, name, &pb.Envelope{MsgId: "bad", Type: "\xff"}, Mark{Stream: []byte("bad"), Seq: seq}); err == nil {
							report(fmt.Errorf("bad message stored"))
						}
					}
				}
			})
		}
	}
	// Declares, forgets, full disk.
	bg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			if _, err := s.Declare(fmt.Sprint("extra", i%50)); err != nil && !errors.Is(err, ErrWrite) && !errors.Is(err, errFull) {
				report(fmt.Errorf("declare: %w", err))
			}
			_ = s.ForgetStreams([]outbox.ForgottenStream{{Stream: []byte("b0-s0"), Watermark: 0}, {Stream: []byte("nothing"), Watermark: 5}})
		}
	})
	bg.Go(func() {
		for !stop.Load() {
			restore, _ := faults.FailCommits(path, fmt.Errorf("write: %w", errFull))
			time.Sleep(200 * time.Microsecond) // the fault's duration, not a wait for a state
			restore()
			time.Sleep(2 * time.Millisecond)
		}
	})
	// A consumer per inbox acks half of what it sees.
	for b := range boxes {
		name := fmt.Sprint("box", b)
		bg.Go(func() {
			var after uint64
			for !stop.Load() {
				msgs, err := s.Pull(ctx, name, after, 50, 0)
				if err != nil {
					report(fmt.Errorf("pull: %w", err))
					continue
				}
				if len(msgs) > 0 {
					last := msgs[len(msgs)-1].GetEventSeq()
					if _, err := s.AckUpTo(name, msgs[len(msgs)/2].GetEventSeq()); err != nil && !errors.Is(err, errFull) {
						report(fmt.Errorf("ack: %w", err)) // only the full disk may refuse it
					}
					after = last
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	bg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}

	// The file against the in-memory view.
	stats := s.Stats()
	err = s.db.View(func(tx *bolt.Tx) error {
		for b := range boxes {
			name := fmt.Sprint("box", b)
			q := tx.Bucket([]byte(prefixQueue + name))
			n := 0
			lastSeq := map[string]uint64{}
			lastCur := uint64(0)
			if err := q.ForEach(func(k, v []byte) error {
				n++
				cur := binary.BigEndian.Uint64(k)
				if cur <= lastCur {
					t.Errorf("%s: cursor %d after %d", name, cur, lastCur)
				}
				lastCur = cur
				var st, seq int
				if _, err := fmt.Sscanf(string(readID(t, v)), "b%d-s%d/%d", new(int), &st, &seq); err != nil {
					t.Errorf("%s: stored %q", name, readID(t, v))
					return nil
				}
				sk := fmt.Sprint(st)
				if uint64(seq) <= lastSeq[sk] {
					t.Errorf("%s: stream %d seq %d stored after seq %d (twice or reordered)", name, st, seq, lastSeq[sk])
				}
				lastSeq[sk] = uint64(seq)
				cmu.Lock()
				want := cursors[key{b, st, uint64(seq)}]
				cmu.Unlock()
				if want != cur {
					t.Errorf("%s: stream %d seq %d at cursor %d, its append said %d", name, st, seq, cur, want)
				}
				return nil
			}); err != nil {
				return err
			}
			if got := stats[name]; got.Depth != n || got.LastCursor != q.Sequence() {
				t.Errorf("%s: Stats %+v, file holds %d messages, last cursor %d", name, got, n, q.Sequence())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	for n, b := range s.boxes {
		if b.held != 0 {
			t.Errorf("%s: %d slots still held", n, b.held)
		}
	}
	s.mu.Unlock()
	s.gmu.Lock()
	if len(s.gqueue) != 0 || s.grunning {
		t.Errorf("group left queued %d running %v", len(s.gqueue), s.grunning)
	}
	s.gmu.Unlock()
}

var errFull = errors.New("no space left on device")

func readID(t *testing.T, v []byte) []byte {
	var e pb.Envelope
	if err := proto.Unmarshal(v, &e); err != nil {
		t.Fatal(err)
	}
	return []byte(e.GetMsgId())
}

// MaxMessages holds under grouped appends, with unencodable messages and
// copies in the same commits.
func TestGroupedAppendsKeepTheBound(t *testing.T) {
	cfg := DefaultConfig(filepath.Join(t.TempDir(), "inbox.db"))
	cfg.MaxMessages = 7
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if _, err := s.Declare("box"); err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		s.wmu.Lock() // everything below queues behind one leader
		var wg sync.WaitGroup
		var stored atomic.Int64
		for i := range 40 {
			wg.Go(func() {
				e := &pb.Envelope{MsgId: fmt.Sprint(round, "/", i)}
				if i%5 == 0 {
					e.Type = "\xff"
				}
				if _, err := s.AppendMarked(context.Background(), "box", e, Mark{Stream: []byte(fmt.Sprint("s", i%3)), Seq: uint64(round*100 + i)}); err == nil {
					stored.Add(1)
				}
			})
		}
		s.wmu.Unlock()
		wg.Wait()
		st := s.Stats()["box"]
		if st.Depth > cfg.MaxMessages {
			t.Fatalf("round %d: depth %d over the bound %d", round, st.Depth, cfg.MaxMessages)
		}
		var n int
		_ = s.db.View(func(tx *bolt.Tx) error { n = tx.Bucket([]byte(prefixQueue + "box")).Stats().KeyN; return nil })
		if n != st.Depth {
			t.Fatalf("round %d: file holds %d, Stats depth %d", round, n, st.Depth)
		}
		if _, err := s.AckUpTo("box", st.LastCursor); err != nil {
			t.Fatal(err)
		}
	}
}

// Close while appends are queued behind a leader: every one returns
// (ErrClosed or stored), nothing hangs or leaks.
func TestCloseWhileAppendsQueueReturnsThemAll(t *testing.T) {
	s, err := Open(DefaultConfig(filepath.Join(t.TempDir(), "inbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	for b := range 4 {
		if _, err := s.Declare(fmt.Sprint("box", b)); err != nil {
			t.Fatal(err)
		}
	}
	s.wmu.Lock()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			_, err := s.Append(context.Background(), fmt.Sprint("box", i%4), &pb.Envelope{MsgId: fmt.Sprint(i)})
			if err != nil && !errors.Is(err, ErrClosed) {
				t.Errorf("append %d: %v", i, err)
			}
		})
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	testutil.WaitFor(t, 10*time.Second, "Close to begin", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed
	})
	s.wmu.Unlock() // Close waits for the write in progress
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

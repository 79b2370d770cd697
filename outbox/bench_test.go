package outbox_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// payload128 is a typical small message body.
var payload128 = string(make([]byte, 128))

// BenchmarkEnqueue measures fsynced enqueues (sequence reserved by the
// caller, as the relay does) with 1, 8 and 64 concurrent callers; group
// commit shares fsyncs among them. linger=0 is the committer without
// CommitLinger, for comparison.
func BenchmarkEnqueue(b *testing.B) {
	def := outbox.DefaultConfig("")
	for _, tc := range []struct {
		callers int
		linger  time.Duration
	}{{1, 0}, {8, 0}, {8, def.CommitLinger}, {64, 0}, {64, def.CommitLinger}} {
		b.Run(fmt.Sprintf("callers=%d/linger=%v", tc.callers, tc.linger), func(b *testing.B) {
			e := open(b, func(c *outbox.Config) { c.CommitLinger = tc.linger })
			b.ReportAllocs()
			before := e.Stats().Fsyncs
			per := (b.N + tc.callers - 1) / tc.callers
			b.ResetTimer()
			var wg sync.WaitGroup
			for c := range tc.callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := fmt.Sprintf("a%d@n1", c%16)
					for range per {
						seq, err := e.ReserveSequence()
						if err == nil {
							_, err = e.Enqueue(context.Background(), &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: r, Type: payload128, Sequence: seq}})
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			n := float64(per * tc.callers)
			b.ReportMetric(n/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(e.Stats().Fsyncs-before)/n, "fsyncs/msg")
		})
	}
}

// preload stores n messages over recipients queues in batches.
func preload(b *testing.B, e *env, n, recipients int) {
	b.Helper()
	batch := make([]*pb.StoredMessage, 0, 4096)
	for i := range n {
		seq, err := e.ReserveSequence()
		if err != nil {
			b.Fatal(err)
		}
		batch = append(batch, &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: fmt.Sprintf("a%d@n1", i%recipients), Type: payload128, Sequence: seq}})
		if len(batch) == cap(batch) || i == n-1 {
			if _, errs := e.EnqueueBatch(context.Background(), batch); errs[0] != nil {
				b.Fatal(errs[0])
			}
			batch = batch[:0]
		}
	}
}

// BenchmarkAckDrain measures Head + Ack of a preloaded backlog in batches
// of 128 over 16 recipients: the store's side of a relay drain.
func BenchmarkAckDrain(b *testing.B) {
	e := open(b, nil)
	const recipients = 16
	preload(b, e, b.N, recipients)
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range recipients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := fmt.Sprintf("a%d@n1", i)
			for {
				msgs, _, err := e.Head(outbox.HeadRequest{Recipient: r, Max: 128})
				if err != nil || len(msgs) == 0 {
					return
				}
				sq := make([]uint64, len(msgs))
				for j, m := range msgs {
					sq[j] = m.GetEnvelope().GetSequence()
				}
				if err := e.Ack(r, sq); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if d := e.Stats().Depth; d != 0 {
		b.Fatalf("depth %d after drain", d)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkCommitStream measures the receiver's durable watermark and key
// updates, one CommitStream per message from 64 concurrent streams.
func BenchmarkCommitStream(b *testing.B) {
	e := open(b, nil)
	const streams = 64
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	per := (b.N + streams - 1) / streams
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sk := outbox.StreamKey("n2", [16]byte{}, 1, fmt.Sprint("actor", i))
			done := make(chan error, 1)
			for j := range per {
				c := &outbox.StreamCommit{Stream: sk, Watermark: uint64(j + 1),
					Keys: [][]byte{outbox.ScopedKey("n2", fmt.Sprint("actor", i), fmt.Sprint("key", j))}}
				e.CommitStream(c, func(err error) { done <- err })
				if err := <-done; err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(per*streams)/b.Elapsed().Seconds(), "commits/s")
}

// BenchmarkEnqueueRecipients: 64 callers enqueue to one recipient or to
// one recipient each. Records of every queue share one bucket keyed by
// sequence, so a commit touching k recipients writes the same few pages as
// one touching one (with a bucket per recipient, as format 2 had, it wrote
// about two pages per recipient): pages/commit and the write-and-fsync
// time per commit show it.
func BenchmarkEnqueueRecipients(b *testing.B) {
	const callers = 64
	for _, recipients := range []int{1, callers} {
		b.Run(fmt.Sprintf("callers=%d/recipients=%d", callers, recipients), func(b *testing.B) {
			e := open(b, nil)
			fs0 := e.Stats().Fsyncs
			pages0, wt0 := e.TxWrites()
			per := (b.N + callers - 1) / callers
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for c := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := fmt.Sprintf("a%d@n1", c%recipients)
					for range per {
						seq, err := e.ReserveSequence()
						if err != nil {
							b.Error(err)
							return
						}
						sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: r, Sender: "@n0", Sequence: seq, Type: payload128}}
						if _, err := e.Enqueue(context.Background(), sm); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			commits := float64(e.Stats().Fsyncs - fs0)
			pages, wt := e.TxWrites()
			b.ReportMetric(float64(per*callers)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(per*callers)/commits, "msgs/commit")
			b.ReportMetric(float64(pages-pages0)/commits, "pages/commit")
			b.ReportMetric(float64((wt-wt0).Microseconds())/commits, "write+fsync-µs/commit")
		})
	}
}

// BenchmarkBoltLayout measures, in bbolt alone, what the store's layout
// costs a commit that appends 57 records of 200 bytes round-robin to 64
// recipients: a bucket per recipient (format 2's layout), one bucket keyed
// by (recipient, sequence), and one keyed by the outbox-wide sequence
// alone (format 3's: appends land on the last pages whatever the
// recipients).
func BenchmarkBoltLayout(b *testing.B) {
	val := make([]byte, 200)
	for _, layout := range []string{"bucket-per-recipient", "recipient-seq-keys", "seq-keys"} {
		b.Run(layout, func(b *testing.B) {
			db, err := bolt.Open(filepath.Join(b.TempDir(), "layout.db"), 0o600, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			var seq uint64
			before := db.Stats()
			b.ResetTimer()
			for range b.N {
				err := db.Update(func(tx *bolt.Tx) error {
					root, err := tx.CreateBucketIfNotExists([]byte("q"))
					if err != nil {
						return err
					}
					for range 57 {
						seq++
						r := fmt.Sprintf("w%d@offline", seq%64)
						k := binary.BigEndian.AppendUint64(nil, seq)
						switch layout {
						case "bucket-per-recipient":
							qb, err := root.CreateBucketIfNotExists([]byte(r))
							if err != nil {
								return err
							}
							err = qb.Put(k, val)
							if err != nil {
								return err
							}
						case "recipient-seq-keys":
							err = root.Put(append([]byte(r+"\x00"), k...), val)
						default:
							err = root.Put(k, val)
						}
						if err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			after := db.Stats()
			d := after.Sub(&before)
			b.ReportMetric(float64(d.TxStats.GetPageCount())/float64(b.N), "pages/commit")
			b.ReportMetric(float64(b.N*57)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkOpenBacklog measures Open of a file holding a backlog of 200k
// messages (128-byte bodies) for one recipient or spread over 64: Open
// checks the file, rebuilds every queue's order from the records and the
// freelist from the pages.
func BenchmarkOpenBacklog(b *testing.B) {
	const backlog = 200_000
	for _, recipients := range []int{1, 64} {
		b.Run(fmt.Sprintf("recipients=%d", recipients), func(b *testing.B) {
			cfg := outbox.DefaultConfig(filepath.Join(b.TempDir(), "outbox.db"))
			s, err := outbox.Open(cfg)
			if err != nil {
				b.Fatal(err)
			}
			msgs := make([]*pb.StoredMessage, 0, 4096)
			for i := range backlog {
				seq, err := s.ReserveSequence()
				if err != nil {
					b.Fatal(err)
				}
				msgs = append(msgs, &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: fmt.Sprintf("w%d@offline", i%recipients), Sender: "@n0", Sequence: seq, Type: payload128}})
				if len(msgs) == cap(msgs) || i == backlog-1 {
					_, errs := s.EnqueueBatch(context.Background(), msgs)
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
					msgs = msgs[:0]
				}
			}
			if err := s.Close(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				s, err := outbox.Open(cfg)
				if err != nil {
					b.Fatal(err)
				}
				if d := s.Stats().Depth; d != backlog {
					b.Fatalf("depth %d after Open, want %d", d, backlog)
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

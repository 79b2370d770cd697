package harness

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/node"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// pipeWindow is how many unacknowledged messages one pipelining producer
// keeps in flight, on both sides: about JetStream's own default for
// PublishAsync (4000).
const pipeWindow = 4096

// meshPipelined: one goroutine sends with TellReliableAsync to an actor on
// a node that is not in the cluster, keeping at most pipeWindow Pendings
// unresolved; the time ends when the last Pending resolved (every message
// fsynced).
func (e *env) meshPipelined(payload []byte) (rate, fsyncsPerMsg float64, err error) {
	n, err := e.startNode("n1", "pipelined")
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = n.Close() }()
	msg := wrapperspb.Bytes(payload)
	ctx := context.Background()
	to := node.Addr("w", "offline")
	before := n.Outbox().Stats().Fsyncs
	ring := make([]*node.Pending, pipeWindow)
	wait := func(p *node.Pending) error {
		if p == nil {
			return nil
		}
		out, err := p.Outcome()
		if err == nil && out != node.Queued {
			err = fmt.Errorf("outcome %v, want Queued (the peer is offline)", out)
		}
		return err
	}
	start := time.Now()
	sent := 0
	for sent < e.cfg.N && (sent%256 != 0 || time.Since(start) < e.cfg.Duration) {
		if err := wait(ring[sent%pipeWindow]); err != nil {
			return 0, 0, fmt.Errorf("bench: meshnode pipelined: %w", err)
		}
		p, err := n.TellReliableAsync(ctx, to, msg)
		if err != nil {
			return 0, 0, fmt.Errorf("bench: meshnode pipelined: %w", err)
		}
		ring[sent%pipeWindow] = p
		sent++
	}
	for _, p := range ring {
		if err := wait(p); err != nil {
			return 0, 0, fmt.Errorf("bench: meshnode pipelined: %w", err)
		}
	}
	elapsed := time.Since(start)
	fs := n.Outbox().Stats().Fsyncs - before
	return float64(sent) / elapsed.Seconds(), ratio(float64(fs), float64(sent)), nil
}

// jetStreamAsync: one goroutine publishes with PublishAsync (at most
// pipeWindow acks outstanding) to a file-backed stream; the time ends when
// every ack came back.
func (e *env) jetStreamAsync(payload []byte, syncAlways bool) (float64, error) {
	ns, err := e.startNATS(true, syncAlways, fmt.Sprintf("js-async-%t", syncAlways))
	if err != nil {
		return 0, err
	}
	defer ns.close()
	nc, err := ns.connect()
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	var failed atomic.Int64
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(pipeWindow),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
	if err != nil {
		return 0, fmt.Errorf("bench: jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage,
	}); err != nil {
		return 0, fmt.Errorf("bench: jetstream create stream: %w", err)
	}
	start := time.Now()
	sent := 0
	for sent < e.cfg.N && (sent%256 != 0 || time.Since(start) < e.cfg.Duration) {
		// A full window makes PublishAsync give up after its stall wait:
		// try again, as a producer would, until an ack frees a slot.
		for {
			_, err := js.PublishAsync("bench.pipelined", payload)
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) || ctx.Err() != nil {
				return 0, fmt.Errorf("bench: JetStream async publish: %w", err)
			}
		}
		sent++
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, fmt.Errorf("bench: JetStream async publish: acks: %w", ErrTimeout)
	}
	elapsed := time.Since(start)
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("bench: JetStream async publish: %d of %d not acknowledged", f, sent)
	}
	return float64(sent) / elapsed.Seconds(), nil
}

// commitLatency measures one bbolt write transaction of records Puts,
// fsynced, on the run's disk, back to back for cfg.Duration (at least 20
// commits). Each record is a key and value of size bytes together (what a
// queued message takes in meshnode's outbox, storedRecordSize), and the
// file is opened and filled as the outbox does (no freelist written per
// commit, leaves packed full): what is measured is what the disk costs
// for meshnode's bytes, not bbolt's defaults. With one record it is the
// physical bound of a caller that waits for its own durable write; with
// N, the bound of N such callers that share every commit perfectly. It
// returns the mean (what a sequential caller's rate is bound by) and the
// median.
func (e *env) commitLatency(size, records int) (mean, median time.Duration, err error) {
	path := filepath.Join(e.dir, fmt.Sprintf("commit-latency-%d", records), "bench.db")
	if err := mkdirFor(path); err != nil {
		return 0, 0, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return 0, 0, fmt.Errorf("bench: bbolt open: %w", err)
	}
	defer func() { _ = db.Close() }()
	bucket := []byte("q")
	value := make([]byte, max(size-8, 1)) // the key is 8 bytes
	var lat []time.Duration
	start := time.Now()
	for len(lat) < 20 || time.Since(start) < e.cfg.Duration {
		t0 := time.Now()
		err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists(bucket)
			if err != nil {
				return err
			}
			b.FillPercent = 1 // keys ascend, as the outbox's do
			for range records {
				seq, err := b.NextSequence()
				if err != nil {
					return err
				}
				if err := b.Put(u64key(seq), value); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, 0, fmt.Errorf("bench: bbolt commit: %w", err)
		}
		lat = append(lat, time.Since(t0))
	}
	total := time.Since(start)
	slices.Sort(lat)
	return total / time.Duration(len(lat)), lat[len(lat)/2], nil
}

// storedRecordSize is the mean size, key and value, of a queued message
// of payload in meshnode's outbox: a node queues some for a peer that is
// offline and is closed, and the file's largest bucket (by keys: the
// queued messages) is read.
func (e *env) storedRecordSize(payload []byte) (int, error) {
	const sub, name, msgs = "record-size", "n1", 200
	n, err := e.startNode(name, sub)
	if err != nil {
		return 0, err
	}
	msg := wrapperspb.Bytes(payload)
	for range msgs {
		if _, err := n.TellReliable(context.Background(), node.Addr("w", "offline"), msg); err != nil {
			_ = n.Close()
			return 0, fmt.Errorf("bench: record size: %w", err)
		}
	}
	if err := n.Close(); err != nil {
		return 0, fmt.Errorf("bench: record size: close: %w", err)
	}
	db, err := bolt.Open(filepath.Join(e.dir, sub, name, "outbox.db"), 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("bench: record size: %w", err)
	}
	defer func() { _ = db.Close() }()
	most, bytes := 0, 0
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
			keys, sum := 0, 0
			if err := b.ForEach(func(k, v []byte) error {
				keys, sum = keys+1, sum+len(k)+len(v)
				return nil
			}); err != nil {
				return err
			}
			if keys > most {
				most, bytes = keys, sum
			}
			return nil
		})
	})
	if err != nil {
		return 0, fmt.Errorf("bench: record size: %w", err)
	}
	if most < msgs {
		return 0, fmt.Errorf("bench: record size: no bucket of the outbox holds the %d messages queued (largest: %d keys)", msgs, most)
	}
	return bytes / most, nil
}

func u64key(v uint64) []byte {
	var k [8]byte
	for i := 7; i >= 0; i-- {
		k[i] = byte(v)
		v >>= 8
	}
	return k[:]
}

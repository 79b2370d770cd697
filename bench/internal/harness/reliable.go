package harness

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/node"
	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// concurrent runs senders goroutines that call op until cfg.N calls in all
// or cfg.Duration, and returns completed calls per second. op gets the
// sender's index.
func concurrent(cfg Config, what string, senders int, op func(sender int) error) (float64, int64, error) {
	var next, done atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(cfg.N) && time.Now().Before(deadline) {
				if err := op(s); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("bench: %s: %w", what, err) })
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return 0, done.Load(), firstErr
	}
	return float64(done.Load()) / elapsed.Seconds(), done.Load(), nil
}

// reliablePhase measures durable enqueue to an offline peer at each
// senders level against the physical limit of a caller that waits for its
// own commit (N / one commit's latency, measured first in the same run),
// JetStream file-backed publish (default sync and sync-always) and bbolt's
// group commit alone; then the pipelined send against JetStream's async
// publish.
func (e *env) reliablePhase() ([]Row, error) {
	payload := make([]byte, e.cfg.Payload)
	var rows []Row
	top := 0
	for _, s := range e.cfg.Senders {
		top = max(top, s)
	}
	size, err := e.storedRecordSize(payload)
	if err != nil {
		return nil, err
	}
	lat, med, err := e.commitLatency(size, 1)
	if err != nil {
		return nil, err
	}
	e.cfg.logf("reliable: one bbolt commit %v (mean), %v (median), records of %d B", lat, med, size)
	rows = append(rows, Row{Phase: "bbolt commit latency (one fsynced write)",
		Meshnode: Figure{Value: float64(lat.Microseconds()), Unit: "µs"},
		Note: fmt.Sprintf("mean of back-to-back commits for -duration (median %v) of one %d-B record, a queued message's size in the outbox, written as the outbox does; the bounds below are N / this",
			med.Round(time.Microsecond), size)})
	for _, s := range e.cfg.Senders {
		m, fsyncs, err := e.meshReliable(payload, s, false)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("reliable s=%d: meshnode %.0f msgs/s (%.3f fsyncs/msg)", s, m, fsyncs)
		jd, err := e.jetStream(payload, s, false)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("reliable s=%d: JetStream default sync %.0f msgs/s", s, jd)
		ja, err := e.jetStream(payload, s, true)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("reliable s=%d: JetStream sync-always %.0f msgs/s", s, ja)
		bb, err := e.boltBatch(payload, s)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("reliable s=%d: bbolt Batch %.0f msgs/s", s, bb)
		mf := Figure{Value: m, Unit: "msgs/s"}
		phase := fmt.Sprintf("tell-reliable offline s=%d", s)
		bound := float64(s) / lat.Seconds()
		r := ratio(m, bound)
		note := fmt.Sprintf("%.3f fsyncs/msg", fsyncs)
		var nrow *Row
		if s > 1 {
			// The bound prices a commit of N records like one of a single
			// record; here is what a commit of N costs on this disk, and so
			// the most of the bound any N callers could reach.
			nlat, _, err := e.commitLatency(size, s)
			if err != nil {
				return nil, err
			}
			e.cfg.logf("reliable s=%d: one bbolt commit of %d records %v (mean)", s, s, nlat)
			nb := float64(s) / nlat.Seconds()
			note += fmt.Sprintf("; a commit of %d records costs %.2f× one here, so no %d callers can pass %.2f× of this bound", s, float64(nlat)/float64(lat), s, float64(lat)/float64(nlat))
			nrow = &Row{Phase: phase + " vs N / latency of an N-record commit", Meshnode: mf,
				Comparison: &Figure{Name: fmt.Sprintf("%d / %v", s, nlat.Round(time.Microsecond)), Value: nb, Unit: "msgs/s"},
				Ratio:      ratio(m, nb), Note: "informational: every caller in every commit, none waiting between them"}
		}
		rows = append(rows,
			Row{Phase: phase + " vs N / commit latency", Meshnode: mf,
				Comparison: &Figure{Name: fmt.Sprintf("%d / %v", s, lat.Round(time.Microsecond)), Value: bound, Unit: "msgs/s"},
				Ratio:      r, Target: "≥ 0.8×", Met: yesNo(r >= 0.8), Note: note})
		if nrow != nil {
			rows = append(rows, *nrow)
		}
		rows = append(rows,
			Row{Phase: phase + " vs JetStream (default sync)", Meshnode: mf,
				Comparison: &Figure{Name: "JetStream file, default sync", Value: jd, Unit: "msgs/s"}, Ratio: ratio(m, jd)},
			Row{Phase: phase + " vs JetStream (sync always)", Meshnode: mf,
				Comparison: &Figure{Name: "JetStream file, sync always", Value: ja, Unit: "msgs/s"}, Ratio: ratio(m, ja)},
			Row{Phase: phase + " vs bbolt Batch", Meshnode: mf,
				Comparison: &Figure{Name: fmt.Sprintf("bbolt Batch, %d goroutines", s), Value: bb, Unit: "msgs/s"}, Ratio: ratio(m, bb)},
		)
	}
	// The same top level with one recipient per sender: shows how much of
	// the figure is per-recipient work rather than the store.
	if top > 1 {
		m, fsyncs, err := e.meshReliable(payload, top, true)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("reliable s=%d, one recipient each: meshnode %.0f msgs/s", top, m)
		rows = append(rows, Row{Phase: fmt.Sprintf("tell-reliable offline s=%d, %d recipients", top, top),
			Meshnode: Figure{Value: m, Unit: "msgs/s"}, Note: fmt.Sprintf("informational; %.3f fsyncs/msg", fsyncs)})
	}
	pm, pfs, err := e.meshPipelined(payload)
	if err != nil {
		return nil, err
	}
	e.cfg.logf("reliable pipelined: meshnode %.0f msgs/s (%.4f fsyncs/msg)", pm, pfs)
	pd, err := e.jetStreamAsync(payload, false)
	if err != nil {
		return nil, err
	}
	e.cfg.logf("reliable pipelined: JetStream async default sync %.0f msgs/s", pd)
	pa, err := e.jetStreamAsync(payload, true)
	if err != nil {
		return nil, err
	}
	e.cfg.logf("reliable pipelined: JetStream async sync-always %.0f msgs/s", pa)
	pf := Figure{Value: pm, Unit: "msgs/s"}
	phase := fmt.Sprintf("tell-reliable pipelined, 1 producer, window %d", pipeWindow)
	rows = append(rows,
		Row{Phase: phase + " vs JetStream async (default sync)", Meshnode: pf,
			Comparison: &Figure{Name: "JetStream PublishAsync, default sync", Value: pd, Unit: "msgs/s"},
			Ratio:      ratio(pm, pd), Target: "≥ 1.0×", Met: yesNo(pm >= pd),
			Note: fmt.Sprintf("meshnode fsyncs before it acks: %.4f fsyncs/msg", pfs)},
		Row{Phase: phase + " vs JetStream async (sync always)", Meshnode: pf,
			Comparison: &Figure{Name: "JetStream PublishAsync, sync always", Value: pa, Unit: "msgs/s"}, Ratio: ratio(pm, pa)},
	)
	return rows, nil
}

// meshReliable: TellReliable from senders goroutines to an actor on a node
// that is not in the cluster, so every call is a durable enqueue. With
// spread each sender has its own recipient; otherwise all share one.
func (e *env) meshReliable(payload []byte, senders int, spread bool) (rate, fsyncsPerMsg float64, err error) {
	sub := fmt.Sprintf("reliable-%d-%t", senders, spread)
	n, err := e.startNode("n1", sub)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = n.Close() }()
	msg := wrapperspb.Bytes(payload)
	ctx := context.Background()
	before := n.Outbox().Stats().Fsyncs
	rate, done, err := concurrent(e.cfg, "meshnode tell-reliable", senders, func(s int) error {
		to := node.Addr("w", "offline")
		if spread {
			to = node.Addr(fmt.Sprintf("w%d", s), "offline")
		}
		out, err := n.TellReliable(ctx, to, msg)
		if err != nil {
			return err
		}
		if out != node.Queued {
			return fmt.Errorf("outcome %v, want Queued (the peer is offline)", out)
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	fs := n.Outbox().Stats().Fsyncs - before
	return rate, ratio(float64(fs), float64(done)), nil
}

// jetStream: senders goroutines publish synchronously (each waits for its
// ack) to a file-backed stream on one connection.
func (e *env) jetStream(payload []byte, senders int, syncAlways bool) (float64, error) {
	ns, err := e.startNATS(true, syncAlways, fmt.Sprintf("js-%d-%t", senders, syncAlways))
	if err != nil {
		return 0, err
	}
	defer ns.close()
	nc, err := ns.connect()
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
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
	rate, _, err := concurrent(e.cfg, "JetStream publish", senders, func(int) error {
		_, err := js.Publish(ctx, "bench.reliable", payload)
		return err
	})
	return rate, err
}

// boltBatch: senders goroutines each Put one record through db.Batch, with
// MaxBatchSize = senders so a full group commits at once instead of waiting
// for MaxBatchDelay. NoSync is false: every commit fsyncs.
func (e *env) boltBatch(payload []byte, senders int) (float64, error) {
	path := filepath.Join(e.dir, fmt.Sprintf("bolt-%d", senders), "bench.db")
	if err := mkdirFor(path); err != nil {
		return 0, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return 0, fmt.Errorf("bench: bbolt open: %w", err)
	}
	defer func() { _ = db.Close() }()
	db.MaxBatchSize = senders
	bucket := []byte("q")
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(bucket); return err }); err != nil {
		return 0, fmt.Errorf("bench: bbolt bucket: %w", err)
	}
	rate, _, err := concurrent(e.cfg, "bbolt Batch", senders, func(int) error {
		return db.Batch(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucket)
			seq, err := b.NextSequence()
			if err != nil {
				return err
			}
			return b.Put(binary.BigEndian.AppendUint64(nil, seq), payload)
		})
	})
	return rate, err
}

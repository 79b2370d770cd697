package inbox

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/outbox"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ForgetStreams drops the records of what the inboxes stored of streams
// the node forgot, idle past its stream retention: by then their senders
// have given up whatever they could send again, and a later message of
// such a stream is at or below the forgotten watermark (refused there) or
// new (stored). A record above the forgotten watermark is kept: the node
// would not refuse a copy it covers (the inbox stored it and a crash came
// before the watermark's commit, or it was stored after the node decided
// to forget). Without this every stream ever seen, one per sender outbox,
// epoch and inbox, would stay in the file.
func (s *Store) ForgetStreams(streams []outbox.ForgottenStream) error {
	err := s.update(func(tx *bolt.Tx) error {
		if err := faults.CommitError(s.cfg.Path); err != nil {
			return err // a test's full disk
		}
		sb := tx.Bucket(bucketStreams)
		for _, f := range streams {
			if m := readMark(sb, f.Stream); m.seq > f.Watermark {
				continue
			}
			if err := sb.Delete(f.Stream); err != nil {
				return err
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return ErrClosed
	case err != nil:
		return fmt.Errorf("inbox: forget streams: %w: %w", ErrWrite, err)
	}
	return nil
}

// Forgetter passes the streams a node forgot (outbox.Config.OnForget) on
// to ForgetStreams, off the node's committer, which must not wait for the
// inbox's commit. Close waits for what is under way; what is added after
// it, or refused by the disk, stays in the file (a few dozen bytes each).
type Forgetter struct {
	st  *Store
	log *slog.Logger

	mu      sync.Mutex
	pending []outbox.ForgottenStream
	running bool
	closed  bool
	wg      sync.WaitGroup
}

// NewForgetter returns a Forgetter for st that logs to log.
func NewForgetter(st *Store, log *slog.Logger) *Forgetter {
	return &Forgetter{st: st, log: log}
}

// Add queues streams to forget; it never blocks.
func (f *Forgetter) Add(streams []outbox.ForgottenStream) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	for _, st := range streams {
		f.pending = append(f.pending, outbox.ForgottenStream{Stream: bytes.Clone(st.Stream), Watermark: st.Watermark})
	}
	if f.running {
		return
	}
	f.running = true
	f.wg.Go(f.run)
}

func (f *Forgetter) run() {
	for {
		f.mu.Lock()
		keys := f.pending
		f.pending = nil
		if len(keys) == 0 || f.closed {
			f.running = false
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		if err := f.st.ForgetStreams(keys); err != nil {
			f.log.Warn("inbox: records of forgotten streams not dropped; they stay in the file", "streams", len(keys), "err", err)
		}
	}
}

// Close stops taking streams and waits for the ones under way.
func (f *Forgetter) Close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.wg.Wait()
}

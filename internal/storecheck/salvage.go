package storecheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// SalvageReport says what Salvage found and copied.
type SalvageReport struct {
	Source  Report // the source's problems, and what was readable
	Buckets int    // buckets created in the copy
	Keys    int64  // keys copied
	Skipped int64  // readable keys that could not be written (a key at the root, a key named like a bucket)
}

// salvageBatch bounds one transaction of the copy.
const salvageBatch = 8 << 20

// Salvage copies every readable bucket (with its sequence), key and value
// of the bbolt file at src into a new bbolt file at dst, which must not
// exist. Pages that cannot be read are skipped, with everything below
// them, and listed in the report. It never writes src and never panics on
// what src holds.
func Salvage(src, dst string) (SalvageReport, error) {
	var rep SalvageReport
	if _, err := os.Stat(dst); !errors.Is(err, fs.ErrNotExist) {
		return rep, fmt.Errorf("storecheck: salvage into %s: the file exists", dst)
	}
	f, err := os.Open(src)
	if err != nil {
		return rep, fmt.Errorf("storecheck: %w", err)
	}
	defer func() { _ = f.Close() }()
	if err := lockShared(f, time.Second); err != nil {
		return rep, fmt.Errorf("storecheck: salvage %s: %w (stop the node using it)", src, err)
	}
	w, err := newWalker(f, &rep.Source, true)
	if err != nil {
		return rep, fmt.Errorf("storecheck: salvage %s: nothing readable: %w", src, err)
	}
	db, err := bolt.Open(dst, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return rep, fmt.Errorf("storecheck: salvage into %s: %w", dst, err)
	}
	c := &copier{db: db, rep: &rep}
	w.bucket = func(path [][]byte, seq uint64) { c.add(salvageOp{path: clone2(path), seq: seq, bucket: true}) }
	w.visit = func(path [][]byte, k, v []byte) {
		c.add(salvageOp{path: clone2(path), key: clone(k), value: clone(v)})
	}
	w.walk()
	c.flush()
	if cerr := db.Close(); c.err == nil {
		c.err = cerr
	}
	if c.err != nil {
		return rep, fmt.Errorf("storecheck: salvage into %s: %w", dst, c.err)
	}
	return rep, nil
}

type salvageOp struct {
	path       [][]byte
	key, value []byte
	seq        uint64
	bucket     bool
}

// copier writes the walk's findings in transactions of salvageBatch bytes.
type copier struct {
	db    *bolt.DB
	rep   *SalvageReport
	ops   []salvageOp
	bytes int
	err   error
}

func (c *copier) add(op salvageOp) {
	c.ops = append(c.ops, op)
	c.bytes += len(op.key) + len(op.value) + 64
	if c.bytes >= salvageBatch {
		c.flush()
	}
}

func (c *copier) flush() {
	if c.err != nil || len(c.ops) == 0 {
		c.ops, c.bytes = c.ops[:0], 0
		return
	}
	c.err = c.db.Update(func(tx *bolt.Tx) error {
		for _, op := range c.ops {
			if len(op.path) == 0 {
				c.rep.Skipped++ // bbolt keeps only buckets at its root
				continue
			}
			b, err := tx.CreateBucketIfNotExists(op.path[0])
			for _, p := range op.path[1:] {
				if err != nil {
					break
				}
				b, err = b.CreateBucketIfNotExists(p)
			}
			if err != nil {
				c.rep.Skipped++
				continue
			}
			if op.bucket {
				c.rep.Buckets++
				if err := b.SetSequence(op.seq); err != nil {
					return err
				}
				continue
			}
			if err := b.Put(op.key, op.value); err != nil {
				c.rep.Skipped++
				continue
			}
			c.rep.Keys++
		}
		return nil
	})
	c.ops, c.bytes = c.ops[:0], 0
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

func clone2(p [][]byte) [][]byte {
	out := make([][]byte, len(p))
	for i := range p {
		out[i] = clone(p[i])
	}
	return out
}

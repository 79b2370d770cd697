// Package faults lets tests make a real store's disk fail. The stores on
// bbolt files (the outbox, the daemon's inbox) ask CommitError before each
// write transaction; a test names a file and the error its commits get, as
// a full or failing disk would give. For failures inside bbolt's own
// writes (a meta page written and its fsync failing), a store calls
// HookWrites when it opens its file. Nothing is registered outside tests,
// and then the checks are one atomic load, and one map lookup per Open.
package faults

import (
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"unsafe"

	bolt "go.etcd.io/bbolt"
)

var (
	armed atomic.Int32 // len(commits): CommitError's fast path

	// mu guards the fields below.
	mu      sync.Mutex
	commits map[string]*fault
)

type fault struct {
	err  error
	hits int
}

// FailCommits makes every commit of the store on file path fail with err
// until the returned restore is called. Hits reports how many commits
// failed so far.
func FailCommits(path string, err error) (restore func(), hits func() int) {
	f := &fault{err: err}
	mu.Lock()
	if commits == nil {
		commits = map[string]*fault{}
	}
	if _, ok := commits[path]; !ok {
		armed.Add(1)
	}
	commits[path] = f
	mu.Unlock()
	restore = func() {
		mu.Lock()
		defer mu.Unlock()
		if commits[path] == f {
			delete(commits, path)
			armed.Add(-1)
		}
	}
	hits = func() int {
		mu.Lock()
		defer mu.Unlock()
		return f.hits
	}
	return restore, hits
}

// CommitError returns the error a commit of the store on file path must
// fail with, or nil.
func CommitError(path string) error {
	if armed.Load() == 0 {
		return nil
	}
	mu.Lock()
	defer mu.Unlock()
	f := commits[path]
	if f == nil {
		return nil
	}
	f.hits++
	return f.err
}

// writeFaults are the bbolt files whose writes a test routes through a
// fault (FailWrites), by path. Guarded by mu.
var writeFaults map[string]*writeFault

type writeFault struct {
	err  error
	fail func(meta bool) bool
}

// FailWrites makes bbolt's writes to the file at path fail with err while
// fail says so, for the stores opened on it after this call (HookWrites).
// A write of a data page fails without writing: a full disk, or a failing
// one. A write of the meta page reaches the file and then reports err: the
// state a failing fsync of the meta page leaves, where bbolt has written
// the commit (readers see it) and returns the error. restore removes the
// fault from stores opened later; a store already hooked keeps asking fail.
func FailWrites(path string, err error, fail func(meta bool) bool) (restore func()) {
	f := &writeFault{err: err, fail: fail}
	mu.Lock()
	if writeFaults == nil {
		writeFaults = map[string]*writeFault{}
	}
	writeFaults[path] = f
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		if writeFaults[path] == f {
			delete(writeFaults, path)
		}
	}
}

// HookWrites is called by a store right after bbolt opened its file at
// path, before any write: when a test registered a fault for path
// (FailWrites), bbolt's file writes go through it from then on. bbolt has
// no option for this, so the hook replaces its unexported write function;
// an error says this bbolt no longer has it. Without a registered fault it
// does nothing.
func HookWrites(path string, db *bolt.DB) error {
	mu.Lock()
	f := writeFaults[path]
	mu.Unlock()
	if f == nil {
		return nil
	}
	v := reflect.ValueOf(db).Elem().FieldByName("ops").FieldByName("writeAt")
	if !v.IsValid() || v.Type() != reflect.TypeFor[func([]byte, int64) (int, error)]() {
		return errors.New("faults: bbolt.DB has no ops.writeAt of the known type; FailWrites needs updating for this bbolt")
	}
	writeAt := (*func([]byte, int64) (int, error))(unsafe.Pointer(v.UnsafeAddr()))
	orig, metaEnd := *writeAt, int64(2*db.Info().PageSize)
	*writeAt = func(b []byte, off int64) (int, error) {
		meta := off < metaEnd
		if !f.fail(meta) {
			return orig(b, off)
		}
		if !meta {
			return 0, f.err
		}
		if n, err := orig(b, off); err != nil {
			return n, err
		}
		return len(b), f.err
	}
	return nil
}

// Package faults lets tests make a real store's disk fail. The stores on
// bbolt files (the outbox, the daemon's inbox) ask CommitError before each
// write transaction; a test names a file and the error its commits get, as
// a full or failing disk would give. Nothing is registered outside tests,
// and then the check is one atomic load.
package faults

import (
	"sync"
	"sync/atomic"
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

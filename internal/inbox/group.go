package inbox

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// groupCall is one Append waiting for the commit it shares.
type groupCall struct {
	fn   func(*bolt.Tx) error
	err  error
	wake chan bool // true: committed (err says how); false: lead the next commit
}

// group runs fn in a write transaction shared with the other Appends
// waiting at that moment, without waiting for company: a caller that finds
// no commit running commits at once; callers arriving meanwhile queue, and
// the first of them commits for all of them next. One inbox actor appends
// one message at a time, so only appends to different inboxes share a
// commit. fn may run more than once (again without the call that failed
// the transaction), so it sets what it returns afresh each time.
func (s *Store) group(fn func(*bolt.Tx) error) error {
	c := &groupCall{fn: fn, wake: make(chan bool, 1)}
	s.gmu.Lock()
	s.gqueue = append(s.gqueue, c)
	lead := !s.grunning
	s.grunning = true
	s.gmu.Unlock()
	if !lead {
		if done := <-c.wake; done {
			return c.err
		}
	}
	s.gmu.Lock()
	calls := s.gqueue
	s.gqueue = nil
	s.gmu.Unlock()
	s.commitGroup(calls)
	s.gmu.Lock()
	if len(s.gqueue) > 0 {
		s.gqueue[0].wake <- false // hand over: it commits what queued meanwhile
	} else {
		s.grunning = false
	}
	s.gmu.Unlock()
	return c.err
}

// commitGroup commits calls in one transaction and tells each its result.
// A call whose fn fails gets its error alone, and the others commit again
// without it.
func (s *Store) commitGroup(calls []*groupCall) {
	failed := -1
	err := s.update(func(tx *bolt.Tx) error {
		for i, c := range calls {
			if err := c.run(tx); err != nil {
				failed = i
				return err
			}
		}
		return nil
	})
	if failed >= 0 && len(calls) > 1 && !errors.Is(err, ErrFailed) {
		calls[failed].finish(err)
		s.commitGroup(append(calls[:failed:failed], calls[failed+1:]...))
		return
	}
	for _, c := range calls {
		c.finish(err)
	}
}

// run runs c's fn in tx; a panic in it (a caller's bad argument) is its
// error alone, not the leader's, and leaves the hand-over intact.
func (c *groupCall) run(tx *bolt.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("inbox: append panicked: %v", p)
		}
	}()
	return c.fn(tx)
}

func (c *groupCall) finish(err error) {
	c.err = err
	c.wake <- true
}

package node

import (
	"context"
	"sync"
	"time"
)

// deadlineCtx is a context with a deadline that arms no timer until
// something asks for Done. A handler's context needs a deadline (its
// caller's, the message's TTL, HandlerTimeout), but most handlers never
// select on it: context.WithDeadline's cancelCtx, timerCtx and runtime
// timer per message were the largest allocations of an ask on the
// receiving side and a timer start and stop on every reliable message.
// Err is exact without the timer (it reads the clock); Done arms a
// context.WithDeadline child on first use.
//
// Owned by the actor's goroutine that made it, which calls release when
// the handler returns; Done may be called from any goroutine the handler
// starts.
type deadlineCtx struct {
	context.Context // the parent: the node's context, with no deadline
	deadline        time.Time

	// mu guards the fields below.
	mu       sync.Mutex
	child    context.Context // armed by the first Done
	cancel   context.CancelFunc
	released bool
}

// withLazyDeadline returns parent bounded by deadline (or parent's own, if
// earlier) and the release to call when the handler returns.
func withLazyDeadline(parent context.Context, deadline time.Time) *deadlineCtx {
	return new(deadlineCtx).init(parent, deadline)
}

// init makes a zero c what withLazyDeadline returns, in the caller's
// memory (a remote ask's delivery holds one) and returns it.
func (c *deadlineCtx) init(parent context.Context, deadline time.Time) *deadlineCtx {
	if dl, ok := parent.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	c.Context, c.deadline = parent, deadline
	return c
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *deadlineCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *deadlineCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.child == nil {
		c.child, c.cancel = context.WithDeadline(c.Context, c.deadline)
		if c.released {
			c.cancel() // used after its handler returned: already over
		}
	}
	return c.child.Done()
}

// release ends the context: a Done channel handed out is closed and its
// timer stopped.
func (c *deadlineCtx) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = true
	if c.cancel != nil {
		c.cancel()
	}
}

package mailbox

import (
	"runtime"
	"sync"
)

// Runners are goroutines that run mailboxes' handlers and are kept,
// parked, between runs: a mailbox that starts takes the one that parked
// last, whose stack has already grown to what handlers need, instead of
// a new goroutine whose stack starts at its minimum and is copied each
// time it doubles. (A handler that answers over the network goes about
// 3 KiB deep: every ask to an idle actor paid two stack copies, about 3 µs
// of its round trip.)
//
// At most Keep runners stay parked; the others end when their mailbox is
// idle. A parked runner holds only its stack, which the garbage collector
// shrinks while it is unused. The zero value is not usable: NewRunners.
// Safe for concurrent use.
type Runners struct {
	keep   int
	mu     sync.Mutex
	idle   []*runner // parked, the last to park at the end
	closed bool
}

type runner struct {
	job  chan func() // the next mailbox run; nil: end
	done chan struct{}
}

// NewRunners returns a set keeping up to keep parked runners. keep <= 0
// keeps four a core, at least eight: enough for every core to start a
// mailbox on a warm one a few times over. It starts no goroutine.
func NewRunners(keep int) *Runners {
	if keep <= 0 {
		keep = max(8, 4*runtime.GOMAXPROCS(0))
	}
	return &Runners{keep: keep}
}

// run calls fn on a parked runner, or on a new goroutine when none is
// parked (or p is nil, or closed).
func (p *Runners) run(fn func()) {
	if p == nil {
		go fn()
		return
	}
	p.mu.Lock()
	if k := len(p.idle); k > 0 {
		r := p.idle[k-1]
		p.idle[k-1] = nil
		p.idle = p.idle[:k-1]
		p.mu.Unlock()
		r.job <- fn // buffered: the runner is parked or about to be
		return
	}
	closed := p.closed
	p.mu.Unlock()
	if closed {
		go fn()
		return
	}
	r := &runner{job: make(chan func(), 1), done: make(chan struct{})}
	go p.loop(r, fn)
}

// loop runs fn and then each job it is given while parked, until it is
// not kept. A Handle that ends the goroutine (runtime.Goexit) ends the
// runner with it: the mailbox goes on with another.
func (p *Runners) loop(r *runner, fn func()) {
	defer close(r.done)
	for fn != nil {
		fn()
		p.mu.Lock()
		if p.closed || len(p.idle) >= p.keep {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, r)
		p.mu.Unlock()
		fn = <-r.job
	}
}

// Close ends the parked runners and waits for them; runners still
// running a mailbox end when it is idle. After Close, every mailbox run
// starts a goroutine of its own.
func (p *Runners) Close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, r := range idle {
		r.job <- nil
	}
	for _, r := range idle {
		<-r.done
	}
}

// Parked reports how many runners are parked now.
func (p *Runners) Parked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

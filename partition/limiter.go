package partition

import "sync/atomic"

// LimiterConfig sets the AIMD concurrency limit per destination node.
type LimiterConfig struct {
	Initial int // starting limit; default 10
	Min     int // floor of multiplicative decrease; default 1
	Max     int // ceiling of additive increase; default 4096
}

// DefaultLimiterConfig returns the defaults. Max bounds the messages in
// flight to one peer; a relay emission is a batch over one round trip
// (which includes the receiver's group commit), so Max also bounds what one
// peer can receive per round trip. It is shared by all the streams to the
// peer, each of which has at most one emission's worth (Config.BatchSize;
// two half emissions while it drains) out: at 4,096, four streams draining
// at once each send full emissions, where at 1,024 eight streams split one
// emission's worth.
func DefaultLimiterConfig() LimiterConfig {
	return LimiterConfig{
		Initial: 10,   // a new peer starts gently
		Min:     1,    // a full peer still gets one message at a time
		Max:     4096, // four full emissions; chosen by measuring drains over 1, 8 and 64 streams
	}
}

// Limiter is an AIMD concurrency limit for one destination node (a bulkhead
// per peer): +1 on success, ÷2 on a capacity receipt, unchanged on a
// transient error. It is lock-free: every method is a few atomic operations
// and CAS loops, so the relay's delivery goroutines never queue on a mutex.
type Limiter struct {
	cfg      LimiterConfig
	limit    atomic.Int64
	inFlight atomic.Int64
}

// NewLimiter returns a limiter at c.Initial. Out-of-range values are
// clamped so a bad config can never produce a limit of 0 (which would stall
// the peer forever).
func NewLimiter(c LimiterConfig) *Limiter {
	if c.Min < 1 {
		c.Min = 1
	}
	if c.Max < c.Min {
		c.Max = c.Min
	}
	c.Initial = min(max(c.Initial, c.Min), c.Max)
	l := &Limiter{cfg: c}
	l.limit.Store(int64(c.Initial))
	return l
}

// TryAcquire reserves up to n in-flight slots under the current limit and
// returns how many were granted (0 = at the limit, or n <= 0).
func (l *Limiter) TryAcquire(n int) int {
	if n <= 0 {
		return 0
	}
	for {
		in := l.inFlight.Load()
		free := l.limit.Load() - in
		if free <= 0 {
			return 0
		}
		g := min(int64(n), free)
		if l.inFlight.CompareAndSwap(in, in+g) {
			return int(g)
		}
	}
}

// Release returns n slots. Releasing more than is held clamps at zero.
func (l *Limiter) Release(n int) {
	if n <= 0 {
		return
	}
	for {
		in := l.inFlight.Load()
		next := max(in-int64(n), 0)
		if l.inFlight.CompareAndSwap(in, next) {
			return
		}
	}
}

// OnSuccess raises the limit by one, up to Max (additive increase).
func (l *Limiter) OnSuccess() {
	for {
		cur := l.limit.Load()
		if cur >= int64(l.cfg.Max) {
			return
		}
		if l.limit.CompareAndSwap(cur, cur+1) {
			return
		}
	}
}

// OnCapacity halves the limit, down to Min (multiplicative decrease): the
// peer said it is full, or the local send queue to it was.
func (l *Limiter) OnCapacity() {
	for {
		cur := l.limit.Load()
		next := max(cur/2, int64(l.cfg.Min))
		if next == cur || l.limit.CompareAndSwap(cur, next) {
			return
		}
	}
}

// OnTransient leaves the limit unchanged: a transient failure says nothing
// about the peer's capacity. It exists so call sites read symmetrically.
func (l *Limiter) OnTransient() {}

// Limit returns the current concurrency limit.
func (l *Limiter) Limit() int { return int(l.limit.Load()) }

// InFlight returns the slots currently held.
func (l *Limiter) InFlight() int { return int(l.inFlight.Load()) }

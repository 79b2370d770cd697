package mailbox

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Overflow is what a Mailbox does with a new item when it is full.
type Overflow int

const (
	// Reject refuses the new item: Post returns a *CapacityError.
	Reject Overflow = iota
	// DropOldest evicts the oldest queued item (to OnDrop) and queues the new one.
	DropOldest
	// DropNewest drops the new item (to OnDrop) and Post returns a *CapacityError.
	DropNewest
)

// String returns the name ParseOverflow accepts.
func (o Overflow) String() string {
	switch o {
	case Reject:
		return "reject"
	case DropOldest:
		return "drop-oldest"
	case DropNewest:
		return "drop-newest"
	}
	return fmt.Sprintf("Overflow(%d)", int(o))
}

// ParseOverflow parses "reject", "drop-oldest" or "drop-newest".
func ParseOverflow(s string) (Overflow, error) {
	switch s {
	case "reject":
		return Reject, nil
	case "drop-oldest":
		return DropOldest, nil
	case "drop-newest":
		return DropNewest, nil
	}
	return 0, fmt.Errorf("mailbox: parse overflow %q (want reject, drop-oldest or drop-newest): %w", s, ErrBadConfig)
}

// MarshalText implements encoding.TextMarshaler (for TOML/JSON configs).
func (o Overflow) MarshalText() ([]byte, error) {
	if !o.valid() {
		return nil, fmt.Errorf("mailbox: marshal overflow %d: %w", int(o), ErrBadConfig)
	}
	return []byte(o.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler (for TOML/JSON configs).
func (o *Overflow) UnmarshalText(b []byte) error {
	v, err := ParseOverflow(string(b))
	if err != nil {
		return err
	}
	*o = v
	return nil
}

func (o Overflow) valid() bool { return o >= Reject && o <= DropNewest }

// DefaultCapacity is the capacity of a mailbox whose Config.Capacity is 0.
const DefaultCapacity = 1024

// DropReason says why an item was handed to OnDrop.
type DropReason int

const (
	// DroppedOldest: evicted by a newer item under DropOldest.
	DroppedOldest DropReason = iota + 1
	// DroppedNewest: refused under DropNewest because the mailbox was full.
	DroppedNewest
	// DroppedClosed: still queued when the mailbox was closed.
	DroppedClosed
	// DroppedPanicked: Handle panicked on it (a permanent failure).
	DroppedPanicked
)

// String implements fmt.Stringer.
func (r DropReason) String() string {
	switch r {
	case DroppedOldest:
		return "dropped-oldest"
	case DroppedNewest:
		return "dropped-newest"
	case DroppedClosed:
		return "dropped-closed"
	case DroppedPanicked:
		return "dropped-panicked"
	}
	return fmt.Sprintf("DropReason(%d)", int(r))
}

// Config configures a Mailbox.
type Config[T any] struct {
	// Capacity is the maximum number of queued items (not counting the one
	// being handled); 0 means DefaultCapacity, < 0 is invalid.
	Capacity int
	// MaxBytes bounds the queued items by Size as well (0: no bound). An
	// item that alone is larger is accepted into an empty mailbox only, so
	// any item can get through; the mailbox then holds at most MaxBytes
	// plus one item.
	MaxBytes int64
	// Size is what an item costs against MaxBytes; required with MaxBytes.
	// It must give the same value for an item every time.
	Size func(T) int64
	// Overflow says what happens to a new item when the mailbox is full.
	Overflow Overflow
	// Handle is required. It is called for one item at a time, in FIFO
	// order, on a goroutine the mailbox starts only while items are queued.
	// It must not call Close or Drain of its own mailbox (that deadlocks).
	Handle func(T)
	// OnDrop is optional. It is called for every dropped item (a dead-letter
	// event), on the goroutine of Post, Close or the handler. It must not
	// block and must not call Post or Close of the same mailbox. Should it
	// panic, the other items the same Post or Close drops still reach it
	// before the panic goes on to that caller.
	OnDrop func(item T, r DropReason)
	// OnEvict is optional. Under DropOldest it is called for each item
	// evicted, under the mailbox's lock, before the lock is released and
	// OnDrop(item, DroppedOldest) is called: until then the items queued
	// behind it may already be handed to Handle, so a Handle that must
	// not act on an item's successors before the item's OnDrop has
	// returned can mark them here. It must be quick and must not call the
	// mailbox.
	OnEvict func(item T)
}

// DefaultConfig returns a Config with every field set to its default.
// Handle must still be set by the caller.
func DefaultConfig[T any]() Config[T] {
	return Config[T]{
		Capacity: DefaultCapacity, // bounded: 1024 queued items per actor
		MaxBytes: 0,               // no byte bound: the caller knows what its items cost (Size)
		Size:     nil,             // required with MaxBytes
		Overflow: Reject,          // refuse and tell the sender when to retry
		Handle:   nil,             // required: the caller supplies it
		OnDrop:   nil,             // optional: dead-letter events are counted in Stats anyway
		OnEvict:  nil,             // optional
	}
}

// Validate reports the first invalid field.
func (c Config[T]) Validate() error {
	if c.Capacity < 0 {
		return fmt.Errorf("mailbox: config: capacity %d < 0: %w", c.Capacity, ErrBadConfig)
	}
	if !c.Overflow.valid() {
		return fmt.Errorf("mailbox: config: unknown overflow %d: %w", int(c.Overflow), ErrBadConfig)
	}
	if c.Handle == nil {
		return fmt.Errorf("mailbox: config: Handle is required: %w", ErrBadConfig)
	}
	if c.MaxBytes < 0 || (c.MaxBytes > 0 && c.Size == nil) {
		return fmt.Errorf("mailbox: config: MaxBytes %d needs Size and must not be negative: %w", c.MaxBytes, ErrBadConfig)
	}
	return nil
}

// Stats is a snapshot of a mailbox's counters.
type Stats struct {
	Depth          int           // items queued now
	Capacity       int           // maximum items queued
	Bytes          int64         // Size of the items queued now (0 without MaxBytes)
	MaxBytes       int64         // maximum Bytes (0: none)
	Processed      uint64        // Handle calls that returned (including panics)
	Rejected       uint64        // Posts refused under Reject, and PostLows refused under DropOldest
	DroppedOldest  uint64        // items evicted under DropOldest
	DroppedNewest  uint64        // items refused under DropNewest
	DroppedClosed  uint64        // items still queued at Close
	Panicked       uint64        // Handle calls that panicked (item went to OnDrop)
	Wakeups        uint64        // handler goroutines started (idle -> busy transitions)
	HandleTimeEWMA time.Duration // moving average of Handle durations (0: no sample yet)
	Running        bool          // a handler goroutine exists now
	Closed         bool          // Close was called
}

const (
	// minRing is the first buffer size and the size kept after draining,
	// so a mailbox that handles a trickle does not reallocate every time.
	minRing = 8
	// defaultRetryAfter is the hint before any Handle duration was measured.
	defaultRetryAfter = 10 * time.Millisecond
	minRetryAfter     = time.Millisecond
	maxRetryAfter     = 10 * time.Second
	// ewmaWeight is the weight of a new sample in the Handle-time average.
	ewmaWeight = 0.2
	// Handle calls are timed in groups of up to clockEvery while they
	// average under timeEachNs: a clock read costs 20-40 ns, a tenth of
	// a fast Handle, and a group of them is over in microseconds. A
	// handler that turns slow shows in the average after at most
	// clockEvery of its calls (one by one, five calls took it two
	// thirds of the way).
	clockEvery = 16
	timeEachNs = 1000
)

// groupWeight[k] is the weight of a group of k Handle calls of the same
// mean in the average: what k samples of it would weigh together.
var groupWeight = func() (w [clockEvery + 1]float64) {
	for k := 1; k <= clockEvery; k++ {
		w[k] = 1 - math.Pow(1-ewmaWeight, float64(k))
	}
	return w
}()

// Mailbox is a bounded FIFO queue with exactly one consumer. It holds no
// goroutine while idle: Post starts one when it finds the mailbox idle, and
// that goroutine exits when the queue is empty. Safe for concurrent use.
type Mailbox[T any] struct {
	capacity int
	maxBytes int64
	size     func(T) int64
	overflow Overflow
	handle   func(T)
	onDrop   func(T, DropReason)
	onEvict  func(T)
	runFn    func() // m.run bound once so `go m.runFn()` does not allocate per start

	// wg tracks the handler goroutine so Close can wait for it.
	wg sync.WaitGroup

	// mu guards the fields below. It is never held while Handle or OnDrop runs.
	mu sync.Mutex
	// buf is a ring of len(buf) slots holding n items from head. It grows
	// by doubling up to capacity and is released when drained.
	buf     []T
	head    int
	n       int
	bytes   int64         // Size of the queued items (with maxBytes)
	low     *lowItems     // the items that came by PostLow; nil until one did
	running bool          // a handler goroutine exists
	closed  bool          // Close was called
	idle    chan struct{} // closed when the mailbox becomes idle; nil until Drain waits
	ewmaNs  float64       // EWMA of the handle time per item in ns; 0 until the first sample
	taken   int           // items the running Handle took with TakeIf
	stats   Stats         // counters; Depth/Capacity/Running/Closed filled by Stats()
}

// New returns an idle mailbox. It starts no goroutine.
func New[T any](cfg Config[T]) (*Mailbox[T], error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("mailbox: new: %w", err)
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultCapacity
	}
	m := &Mailbox[T]{
		capacity: cfg.Capacity,
		maxBytes: cfg.MaxBytes,
		size:     cfg.Size,
		overflow: cfg.Overflow,
		handle:   cfg.Handle,
		onDrop:   cfg.OnDrop,
		onEvict:  cfg.OnEvict,
	}
	m.runFn = m.run
	return m, nil
}

// Post enqueues item.
//
// When the mailbox is full (Capacity items, or item would take the queued
// bytes over MaxBytes): under Reject, Post returns a *CapacityError with a
// positive RetryAfter; under DropNewest, item is not queued, OnDrop(item,
// DroppedNewest) is called and Post returns a *CapacityError (a drop never
// reports success); under DropOldest, the oldest queued items go to
// OnDrop(old, DroppedOldest) until item fits, item is queued and Post
// returns nil. After Close, Post returns ErrClosed and does not call
// OnDrop.
func (m *Mailbox[T]) Post(item T) error { return m.post(item, false, 0) }

// PostLow is Post for an item of low priority, while the mailbox keeps
// room for items posted with Post: the queued items that came by PostLow
// may take at most half of the capacity (at least one item), at most half
// of MaxBytes, and under MaxBytes at most MaxBytes - keepBytes (keepBytes
// is the size of an item expected back; it may exceed MaxBytes, and then
// no low item is taken). At that bound, or when the mailbox is full, it
// returns a *CapacityError under every overflow strategy, and under
// DropNewest also drops item; under DropOldest it drops nothing queued,
// since the oldest may be what the room is kept for.
func (m *Mailbox[T]) PostLow(item T, keepBytes int64) error { return m.post(item, true, keepBytes) }

func (m *Mailbox[T]) post(item T, low bool, keepBytes int64) error {
	var size int64
	if m.maxBytes > 0 {
		size = m.size(item)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	full, overflow := m.fullLocked(size), m.overflow
	if low {
		full = full || m.lowFullLocked(size, keepBytes)
		if overflow == DropOldest {
			overflow = Reject
		}
	}
	if full {
		switch overflow {
		case DropOldest:
			var old []T
			for m.fullLocked(size) {
				o := m.popLocked()
				if m.onEvict != nil {
					m.onEvict(o)
				}
				old = append(old, o)
			}
			m.pushLocked(item, size, false)
			m.stats.DroppedOldest += uint64(len(old))
			// A runner must exist: the queue was non-empty and runners only
			// exit on an empty queue.
			m.mu.Unlock()
			m.dropAll(old, DroppedOldest)
			return nil
		case DropNewest:
			m.stats.DroppedNewest++
			err := m.capacityErrorLocked()
			m.mu.Unlock()
			m.drop(item, DroppedNewest)
			return err
		default:
			m.stats.Rejected++
			err := m.capacityErrorLocked()
			m.mu.Unlock()
			return err
		}
	}
	m.pushLocked(item, size, low)
	if !m.running {
		m.running = true
		m.stats.Wakeups++
		m.wg.Add(1)
		go m.runFn()
	}
	m.mu.Unlock()
	return nil
}

// TakeIf removes and returns the oldest queued item if take(item) reports
// true; it leaves the queue as it was otherwise. It is for Handle only: a
// handler takes the items waiting behind its own, in order, to handle them
// together (one commit for many). Taken items count as processed; the
// handler owns them from then on (OnDrop is not called for them). take
// runs under the mailbox's lock: it must be quick and must not call the
// mailbox.
func (m *Mailbox[T]) TakeIf(take func(T) bool) (item T, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 || m.closed || !take(m.buf[m.head]) {
		return item, false
	}
	m.stats.Processed++
	m.taken++
	return m.popLocked(), true
}

// Len returns the number of queued items (not counting one being handled).
func (m *Mailbox[T]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}

// Cap returns the capacity.
func (m *Mailbox[T]) Cap() int { return m.capacity }

// Room returns how many more items of size bytes Post would take now: the
// free places, and with MaxBytes no more than the bytes left hold (an
// empty mailbox takes one item of any size).
func (m *Mailbox[T]) Room(size int64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	room := m.capacity - m.n
	if m.maxBytes > 0 && size > 0 {
		fit := max((m.maxBytes-m.bytes)/size, 0)
		if m.n == 0 {
			fit = max(fit, 1)
		}
		room = int(min(int64(room), fit))
	}
	return max(room, 0)
}

// Stats returns a snapshot of the counters.
func (m *Mailbox[T]) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Depth = m.n
	s.Capacity = m.capacity
	s.Bytes, s.MaxBytes = m.bytes, m.maxBytes
	s.Running = m.running
	s.Closed = m.closed
	s.HandleTimeEWMA = time.Duration(m.ewmaNs)
	return s
}

// RetryAfter returns the hint Post would give if the mailbox were full now.
func (m *Mailbox[T]) RetryAfter() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.retryAfterLocked(m.n)
}

// Close stops accepting items, waits for a running Handle call to return,
// and hands the items still queued to OnDrop(DroppedClosed). Idempotent and
// safe to call concurrently; every call returns after the handler goroutine
// has exited. Must not be called from Handle or OnDrop.
func (m *Mailbox[T]) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.wg.Wait()
		return
	}
	m.closed = true
	left := make([]T, 0, m.n)
	for m.n > 0 {
		left = append(left, m.popLocked())
	}
	m.buf, m.low, m.head, m.bytes = nil, nil, 0, 0
	m.stats.DroppedClosed += uint64(len(left))
	if !m.running {
		m.signalIdleLocked()
	}
	m.mu.Unlock()
	m.wg.Wait()
	m.dropAll(left, DroppedClosed)
}

// Drain blocks until the mailbox is empty and no Handle call runs, or ctx
// ends (then it returns ctx's error wrapped). Must not be called from Handle.
func (m *Mailbox[T]) Drain(ctx context.Context) error {
	for {
		m.mu.Lock()
		if m.n == 0 && !m.running {
			m.mu.Unlock()
			return nil
		}
		if m.idle == nil {
			m.idle = make(chan struct{})
		}
		idle := m.idle
		m.mu.Unlock()
		select {
		case <-idle:
			// Loop: a Post may have made it busy again; re-check under mu.
		case <-ctx.Done():
			return fmt.Errorf("mailbox: drain: %w", ctx.Err())
		}
	}
}

// run is the handler goroutine: it handles queued items one at a time and
// exits when the queue is empty or the mailbox is closed.
func (m *Mailbox[T]) run() {
	defer m.wg.Done()
	returned := false
	defer func() {
		if !returned {
			m.handOver()
		}
	}()
	m.mu.Lock()
	// An item's time runs from the end of the one before (the queue's
	// bookkeeping between them is noise against it). Fast Handle calls
	// are timed in groups (clockEvery); a group ends early when the queue
	// empties or a Handle panics, and every call is timed on its own
	// while none was yet or they take over timeEachNs. Monotonic readings
	// since t0 (time.Since) cost half a time.Now.
	t0 := time.Now()
	var start time.Duration
	calls, items := 0, 0 // since the last reading
	for m.n > 0 && !m.closed {
		item := m.popLocked()
		m.taken = 0
		m.mu.Unlock()

		panicked := m.safeHandle(item)

		m.mu.Lock()
		// A Handle that took the items behind its own handled 1+taken
		// items: the hint estimates time per item, so a batching actor is
		// not thought taken times slower than it is.
		calls, items = calls+1, items+1+m.taken
		if calls == clockEvery || m.n == 0 || panicked || m.ewmaNs == 0 || m.ewmaNs >= timeEachNs {
			end := time.Since(t0)
			m.sampleLocked(float64(end-start)/float64(items), calls)
			start, calls, items = end, 0, 0
		}
		m.stats.Processed++
		if panicked {
			m.stats.Panicked++
			m.mu.Unlock()
			m.drop(item, DroppedPanicked)
			m.mu.Lock()
			start = time.Since(t0) // the drop's time is not the next item's
		}
	}
	m.running = false
	if m.n == 0 && len(m.buf) > minRing {
		// Release a grown buffer: idle actors must stay small.
		m.buf, m.low, m.head = nil, nil, 0
	}
	m.signalIdleLocked()
	m.mu.Unlock()
	returned = true
}

// sampleLocked adds calls Handle calls that took d ns per item to the
// average.
func (m *Mailbox[T]) sampleLocked(d float64, calls int) {
	if m.ewmaNs == 0 {
		m.ewmaNs = max(d, 1)
		return
	}
	m.ewmaNs += groupWeight[calls] * (d - m.ewmaNs)
}

// handOver carries on in a new goroutine after a Handle ended run's own
// (runtime.Goexit, as testing's FailNow does): the items behind it are
// handled, and the mailbox does not stay "running" with nobody running it.
func (m *Mailbox[T]) handOver() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.running = false
	if m.n > 0 && !m.closed {
		m.running = true
		m.wg.Add(1) // before run's own Done: a Close waiting sees no gap
		go m.runFn()
		return
	}
	m.signalIdleLocked()
}

// safeHandle calls Handle and recovers a panic (reported, not re-raised:
// one poison item must not kill the actor or the process).
func (m *Mailbox[T]) safeHandle(item T) (panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			panicked = true
		}
	}()
	m.handle(item)
	return false
}

func (m *Mailbox[T]) drop(item T, r DropReason) {
	if m.onDrop != nil {
		m.onDrop(item, r)
	}
}

// dropAll hands each of items to OnDrop. An OnDrop that panics (or ends
// its goroutine) does not cost the items after it theirs: they are handed
// over while the panic unwinds, and the panic then goes on to the caller
// (a later OnDrop's panic replaces an earlier one, as Go does for a
// panic in a deferred call).
func (m *Mailbox[T]) dropAll(items []T, r DropReason) {
	if m.onDrop == nil {
		return
	}
	next := 0
	defer func() {
		if next < len(items) {
			m.dropAll(items[next+1:], r)
		}
	}()
	for _, it := range items {
		m.onDrop(it, r)
		next++
	}
}

func (m *Mailbox[T]) signalIdleLocked() {
	if m.idle != nil {
		close(m.idle)
		m.idle = nil
	}
}

func (m *Mailbox[T]) capacityErrorLocked() *CapacityError {
	return &CapacityError{
		RetryAfter: m.retryAfterLocked(m.n),
		Depth:      m.n,
		Capacity:   m.capacity,
	}
}

// retryAfterLocked estimates the time to drain half of depth items.
func (m *Mailbox[T]) retryAfterLocked(depth int) time.Duration {
	if m.ewmaNs == 0 {
		return defaultRetryAfter
	}
	d := time.Duration(m.ewmaNs * float64(depth) / 2)
	return min(max(d, minRetryAfter), maxRetryAfter)
}

// fullLocked reports whether an item of size finds no room: Capacity items
// are queued, or it would take the bytes over MaxBytes (unless the mailbox
// is empty: any item fits an empty mailbox).
func (m *Mailbox[T]) fullLocked(size int64) bool {
	return m.n >= m.capacity || (m.maxBytes > 0 && m.n > 0 && m.bytes+size > m.maxBytes)
}

// lowItems marks, slot for slot with a mailbox's buf, the items that came
// by PostLow, and counts them and their bytes. A mailbox gets one with
// its first low item, so one that never takes any stays small.
type lowItems struct {
	flags []bool
	n     int
	bytes int64
}

// lowFullLocked reports whether a PostLow item of size finds the low
// items' share taken (PostLow).
func (m *Mailbox[T]) lowFullLocked(size, keepBytes int64) bool {
	var n int
	var bytes int64
	if m.low != nil {
		n, bytes = m.low.n, m.low.bytes
	}
	if n >= max(1, m.capacity/2) {
		return true
	}
	if m.maxBytes <= 0 {
		return false
	}
	return (n > 0 && bytes+size > m.maxBytes/2) || (keepBytes > 0 && bytes+size > m.maxBytes-keepBytes)
}

func (m *Mailbox[T]) pushLocked(item T, size int64, low bool) {
	m.bytes += size
	if m.n == len(m.buf) {
		m.growLocked()
	}
	i := m.head + m.n
	if i >= len(m.buf) {
		i -= len(m.buf)
	}
	m.buf[i] = item
	if low {
		if m.low == nil {
			m.low = &lowItems{flags: make([]bool, len(m.buf))}
		}
		m.low.flags[i] = true
		m.low.n++
		m.low.bytes += size
	}
	m.n++
}

func (m *Mailbox[T]) popLocked() T {
	var zero T
	item := m.buf[m.head]
	m.buf[m.head] = zero // release the reference for the GC
	low := m.low != nil && m.low.flags[m.head]
	if low {
		m.low.flags[m.head] = false
		m.low.n--
	}
	m.head++
	if m.head == len(m.buf) {
		m.head = 0
	}
	m.n--
	if m.n == 0 {
		m.head = 0
	}
	if m.maxBytes > 0 {
		size := m.size(item)
		m.bytes -= size
		if low {
			m.low.bytes -= size
		}
	}
	return item
}

func (m *Mailbox[T]) growLocked() {
	size := min(max(2*len(m.buf), minRing), m.capacity)
	nb := make([]T, size)
	k := copy(nb, m.buf[m.head:])
	if k < m.n {
		copy(nb[k:], m.buf[:m.n-k])
	}
	if m.low != nil {
		nl := make([]bool, size)
		copy(nl, m.low.flags[m.head:])
		if k < m.n {
			copy(nl[k:], m.low.flags[:m.n-k])
		}
		m.low.flags = nl
	}
	m.buf, m.head = nb, 0
}

package mailbox_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
)

const waitTimeout = 5 * time.Second

// dropLog records OnDrop calls.
type dropLog struct {
	mu    sync.Mutex
	items []int
	why   []mailbox.DropReason
}

func (d *dropLog) add(item int, r mailbox.DropReason) {
	d.mu.Lock()
	d.items = append(d.items, item)
	d.why = append(d.why, r)
	d.mu.Unlock()
}

func (d *dropLog) snapshot() ([]int, []mailbox.DropReason) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int(nil), d.items...), append([]mailbox.DropReason(nil), d.why...)
}

// gatedBox is a mailbox whose handler blocks on item 0 until release is
// called, so tests control the queue's depth exactly.
type gatedBox struct {
	m       *mailbox.Mailbox[int]
	drops   *dropLog
	started chan struct{}
	gate    chan struct{}
	once    sync.Once

	mu      sync.Mutex
	handled []int
}

func newGatedBox(tb testing.TB, capacity int, o mailbox.Overflow) *gatedBox {
	tb.Helper()
	g := &gatedBox{drops: &dropLog{}, started: make(chan struct{}), gate: make(chan struct{})}
	m, err := mailbox.New(mailbox.Config[int]{
		Capacity: capacity,
		Overflow: o,
		Handle: func(i int) {
			if i == 0 {
				close(g.started)
				<-g.gate
			}
			g.mu.Lock()
			g.handled = append(g.handled, i)
			g.mu.Unlock()
		},
		OnDrop: g.drops.add,
	})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	g.m = m
	tb.Cleanup(func() { g.release(); m.Close() })
	// Item 0 occupies the handler; the queue is empty after it is taken.
	if err := m.Post(0); err != nil {
		tb.Fatalf("Post(0): %v", err)
	}
	select {
	case <-g.started:
	case <-time.After(waitTimeout):
		tb.Fatal("handler did not start")
	}
	return g
}

func (g *gatedBox) release() { g.once.Do(func() { close(g.gate) }) }

func (g *gatedBox) handledItems() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.handled...)
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestOverflowStrategies(t *testing.T) {
	const capacity = 3
	tests := []struct {
		name        string
		overflow    mailbox.Overflow
		wantErrs    []bool // per Post of items 1..5: error expected
		wantHandled []int
		wantDropped []int
		wantReason  mailbox.DropReason
		check       func(t *testing.T, s mailbox.Stats)
	}{
		{
			name:        "reject",
			overflow:    mailbox.Reject,
			wantErrs:    []bool{false, false, false, true, true},
			wantHandled: []int{0, 1, 2, 3},
			check: func(t *testing.T, s mailbox.Stats) {
				if s.Rejected != 2 {
					t.Errorf("Rejected = %d, want 2", s.Rejected)
				}
			},
		},
		{
			name:        "drop-newest",
			overflow:    mailbox.DropNewest,
			wantErrs:    []bool{false, false, false, true, true},
			wantHandled: []int{0, 1, 2, 3},
			wantDropped: []int{4, 5},
			wantReason:  mailbox.DroppedNewest,
			check: func(t *testing.T, s mailbox.Stats) {
				if s.DroppedNewest != 2 {
					t.Errorf("DroppedNewest = %d, want 2", s.DroppedNewest)
				}
			},
		},
		{
			name:        "drop-oldest",
			overflow:    mailbox.DropOldest,
			wantErrs:    []bool{false, false, false, false, false},
			wantHandled: []int{0, 3, 4, 5},
			wantDropped: []int{1, 2},
			wantReason:  mailbox.DroppedOldest,
			check: func(t *testing.T, s mailbox.Stats) {
				if s.DroppedOldest != 2 {
					t.Errorf("DroppedOldest = %d, want 2", s.DroppedOldest)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGatedBox(t, capacity, tt.overflow)
			for i, wantErr := range tt.wantErrs {
				err := g.m.Post(i + 1)
				if (err != nil) != wantErr {
					t.Fatalf("Post(%d) = %v, want error %v", i+1, err, wantErr)
				}
				if err == nil {
					continue
				}
				var ce *mailbox.CapacityError
				if !errors.As(err, &ce) || !errors.Is(err, mailbox.ErrMailboxFull) {
					t.Fatalf("Post(%d) = %v, want *CapacityError matching ErrMailboxFull", i+1, err)
				}
				if ce.RetryAfter <= 0 || ce.Depth != capacity || ce.Capacity != capacity {
					t.Fatalf("CapacityError = %+v, want positive RetryAfter and depth=capacity=%d", ce, capacity)
				}
			}
			if got := g.m.Len(); got != capacity {
				t.Fatalf("Len = %d, want %d", got, capacity)
			}
			g.release()
			if err := g.m.Drain(context.Background()); err != nil {
				t.Fatalf("Drain: %v", err)
			}
			if got := g.handledItems(); !equalInts(got, tt.wantHandled) {
				t.Errorf("handled %v, want %v", got, tt.wantHandled)
			}
			items, why := g.drops.snapshot()
			if !equalInts(items, tt.wantDropped) {
				t.Errorf("dropped %v, want %v", items, tt.wantDropped)
			}
			for _, r := range why {
				if r != tt.wantReason {
					t.Errorf("drop reason %v, want %v", r, tt.wantReason)
				}
			}
			s := g.m.Stats()
			if s.Processed != uint64(len(tt.wantHandled)) {
				t.Errorf("Processed = %d, want %d", s.Processed, len(tt.wantHandled))
			}
			tt.check(t, s)
		})
	}
}

func TestRetryAfterPlausible(t *testing.T) {
	const capacity = 100
	var gated atomic.Bool
	gate := make(chan struct{})
	m, err := mailbox.New(mailbox.Config[int]{
		Capacity: capacity,
		Handle: func(int) {
			if gated.Load() {
				<-gate
			}
			time.Sleep(time.Millisecond) // simulated work, not synchronisation
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := m.RetryAfter(); got <= 0 {
		t.Fatalf("RetryAfter with no samples = %v, want > 0", got)
	}
	// Warm up the EWMA with ~1 ms handler calls.
	for i := 0; i < 20; i++ {
		if err := m.Post(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	gated.Store(true)
	if err := m.Post(-1); err != nil { // occupies the handler
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitTimeout, "handler took item", func() bool { return m.Len() == 0 })
	for i := 0; i < capacity; i++ {
		if err := m.Post(i); err != nil {
			t.Fatalf("Post %d: %v", i, err)
		}
	}
	err = m.Post(capacity)
	var ce *mailbox.CapacityError
	if !errors.As(err, &ce) {
		t.Fatalf("Post on full = %v, want *CapacityError", err)
	}
	// ewma ≈ 1 ms (more under -race or load) × 100 / 2 ≈ 50 ms.
	if ce.RetryAfter < 5*time.Millisecond || ce.RetryAfter > 2*time.Second {
		t.Errorf("RetryAfter = %v, want within an order of magnitude of 50ms", ce.RetryAfter)
	}
	t.Logf("RetryAfter = %v, HandleTimeEWMA = %v", ce.RetryAfter, m.Stats().HandleTimeEWMA)
	gated.Store(false)
	close(gate)
	if err := m.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSequentialAndPerPosterFIFO(t *testing.T) {
	posters, perPoster := 8, 2000
	if testing.Short() {
		perPoster = 200
	}
	var running atomic.Int32
	var overlaps atomic.Int32
	last := make([]int, posters) // owned by the handler: sequential by contract
	for i := range last {
		last[i] = -1
	}
	var fifoErr atomic.Value
	m, err := mailbox.New(mailbox.Config[[2]int]{
		Capacity: 64, // small, so posters hit Reject and retry
		Handle: func(it [2]int) {
			if running.Add(1) != 1 {
				overlaps.Add(1)
			}
			p, seq := it[0], it[1]
			if seq != last[p]+1 {
				fifoErr.CompareAndSwap(nil, "out of order")
			}
			last[p] = seq
			runtime.Gosched() // widen the window for an overlap to show
			running.Add(-1)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var wg sync.WaitGroup
	for p := 0; p < posters; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; seq < perPoster; {
				err := m.Post([2]int{p, seq})
				switch {
				case err == nil:
					seq++
				case errors.Is(err, mailbox.ErrMailboxFull):
					runtime.Gosched() // retry: a real sender would wait RetryAfter
				default:
					t.Errorf("Post: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := m.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d overlapping Handle calls", n)
	}
	if v := fifoErr.Load(); v != nil {
		t.Fatalf("per-poster FIFO violated: %v", v)
	}
	for p, l := range last {
		if l != perPoster-1 {
			t.Errorf("poster %d: last seq %d, want %d", p, l, perPoster-1)
		}
	}
	if got := m.Stats().Processed; got != uint64(posters*perPoster) {
		t.Errorf("Processed = %d, want %d", got, posters*perPoster)
	}
}

func TestCloseDrainsToOnDrop(t *testing.T) {
	g := newGatedBox(t, 10, mailbox.Reject)
	for i := 1; i <= 4; i++ {
		if err := g.m.Post(i); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan struct{})
	go func() { g.m.Close(); close(closed) }()
	// Close takes the queued items at once, then waits for the running Handle.
	testutil.WaitFor(t, waitTimeout, "close took the queue", func() bool { return g.m.Len() == 0 })
	if err := g.m.Post(99); !errors.Is(err, mailbox.ErrClosed) {
		t.Fatalf("Post after Close = %v, want ErrClosed", err)
	}
	select {
	case <-closed:
		t.Fatal("Close returned while Handle was still running")
	default:
	}
	g.release()
	<-closed
	g.m.Close() // idempotent
	items, why := g.drops.snapshot()
	if !equalInts(items, []int{1, 2, 3, 4}) {
		t.Fatalf("dropped %v, want [1 2 3 4]", items)
	}
	for _, r := range why {
		if r != mailbox.DroppedClosed {
			t.Fatalf("reason %v, want DroppedClosed", r)
		}
	}
	if got := g.handledItems(); !equalInts(got, []int{0}) {
		t.Fatalf("handled %v, want [0]", got)
	}
	s := g.m.Stats()
	if s.DroppedClosed != 4 || !s.Closed || s.Running {
		t.Fatalf("stats %+v", s)
	}
	if err := g.m.Drain(context.Background()); err != nil {
		t.Fatalf("Drain after Close: %v", err)
	}
}

func TestCloseConcurrent(t *testing.T) {
	m, err := mailbox.New(mailbox.Config[int]{Handle: func(int) {}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(2)
		go func() { defer wg.Done(); _ = m.Post(i) }()
		go func() { defer wg.Done(); m.Close() }()
	}
	wg.Wait()
	if !m.Stats().Closed {
		t.Fatal("not closed")
	}
}

func TestDrainHonoursContext(t *testing.T) {
	g := newGatedBox(t, 10, mailbox.Reject)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := g.m.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain = %v, want DeadlineExceeded", err)
	}
	g.release()
	if err := g.m.Drain(context.Background()); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if s := g.m.Stats(); s.Running || s.Depth != 0 {
		t.Fatalf("after Drain: %+v", s)
	}
}

func TestPanicIsRecoveredAndDropped(t *testing.T) {
	drops := &dropLog{}
	var handled atomic.Int32
	m, err := mailbox.New(mailbox.Config[int]{
		Handle: func(i int) {
			if i == 2 {
				panic("poison")
			}
			handled.Add(1)
		},
		OnDrop: drops.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i := 1; i <= 3; i++ {
		if err := m.Post(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	items, why := drops.snapshot()
	if !equalInts(items, []int{2}) || why[0] != mailbox.DroppedPanicked {
		t.Fatalf("drops %v %v, want [2] [DroppedPanicked]", items, why)
	}
	if handled.Load() != 2 {
		t.Fatalf("handled %d, want 2 (the actor survives a panic)", handled.Load())
	}
	if s := m.Stats(); s.Panicked != 1 || s.Processed != 3 {
		t.Fatalf("stats %+v", s)
	}
}

func TestNoGoroutineWhileIdle(t *testing.T) {
	var handled atomic.Int32
	m, err := mailbox.New(mailbox.Config[int]{Handle: func(int) { handled.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Stats().Running {
		t.Fatal("running before any Post")
	}
	for i := 0; i < 100; i++ {
		if err := m.Post(i); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, waitTimeout, "handler goroutine exits when idle", func() bool {
		return !m.Stats().Running
	})
	if handled.Load() != 100 {
		t.Fatalf("handled %d, want 100", handled.Load())
	}
}

func TestConfigValidate(t *testing.T) {
	h := func(int) {}
	tests := []struct {
		name    string
		cfg     mailbox.Config[int]
		wantErr bool
	}{
		{"default with handler", func() mailbox.Config[int] { c := mailbox.DefaultConfig[int](); c.Handle = h; return c }(), false},
		{"zero capacity means default", mailbox.Config[int]{Handle: h}, false},
		{"negative capacity", mailbox.Config[int]{Capacity: -1, Handle: h}, true},
		{"unknown overflow", mailbox.Config[int]{Overflow: 7, Handle: h}, true},
		{"negative overflow", mailbox.Config[int]{Overflow: -1, Handle: h}, true},
		{"no handler", mailbox.Config[int]{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err != nil) != tt.wantErr {
				t.Fatalf("Validate = %v, wantErr %v", err, tt.wantErr)
			}
			m, nerr := mailbox.New(tt.cfg)
			if (nerr != nil) != tt.wantErr {
				t.Fatalf("New = %v, wantErr %v", nerr, tt.wantErr)
			}
			if err != nil && !errors.Is(nerr, mailbox.ErrBadConfig) {
				t.Fatalf("New error %v does not match ErrBadConfig", nerr)
			}
			if m != nil {
				if tt.cfg.Capacity == 0 && m.Cap() != mailbox.DefaultCapacity {
					t.Fatalf("Cap = %d, want %d", m.Cap(), mailbox.DefaultCapacity)
				}
				m.Close()
			}
		})
	}
}

func TestParseOverflow(t *testing.T) {
	for _, o := range []mailbox.Overflow{mailbox.Reject, mailbox.DropOldest, mailbox.DropNewest} {
		got, err := mailbox.ParseOverflow(o.String())
		if err != nil || got != o {
			t.Errorf("ParseOverflow(%q) = %v, %v", o.String(), got, err)
		}
		b, err := o.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back mailbox.Overflow
		if err := back.UnmarshalText(b); err != nil || back != o {
			t.Errorf("UnmarshalText(%q) = %v, %v", b, back, err)
		}
	}
	for _, bad := range []string{"", "Reject", "drop", "drop_oldest"} {
		if _, err := mailbox.ParseOverflow(bad); !errors.Is(err, mailbox.ErrBadConfig) {
			t.Errorf("ParseOverflow(%q) = %v, want ErrBadConfig", bad, err)
		}
	}
	if s := mailbox.Overflow(9).String(); s != "Overflow(9)" {
		t.Errorf("String = %q", s)
	}
	for r, want := range map[mailbox.DropReason]string{
		mailbox.DroppedOldest: "dropped-oldest", mailbox.DroppedNewest: "dropped-newest",
		mailbox.DroppedClosed: "dropped-closed", mailbox.DroppedPanicked: "dropped-panicked", 0: "DropReason(0)",
	} {
		if r.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(r), r.String(), want)
		}
	}
}

// TestBufferGrowsAndShrinks fills a mailbox well past the initial ring, in
// wrapped positions, and checks FIFO order survives growth.
func TestBufferGrowsAndShrinks(t *testing.T) {
	g := newGatedBox(t, 100, mailbox.DropOldest)
	// 150 posts into capacity 100 under DropOldest: ring wraps and grows.
	for i := 1; i <= 150; i++ {
		if err := g.m.Post(i); err != nil {
			t.Fatal(err)
		}
	}
	g.release()
	if err := g.m.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []int{0}
	for i := 51; i <= 150; i++ {
		want = append(want, i)
	}
	if got := g.handledItems(); !equalInts(got, want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
	items, _ := g.drops.snapshot()
	if len(items) != 50 || items[0] != 1 || items[49] != 50 {
		t.Fatalf("dropped %v, want 1..50", items)
	}
}

// TestIdleMailboxMemory checks the "100k idle actors under 2 KB each" target.
func TestIdleMailboxMemory(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	per := idleBytesPerMailbox(t, n, false)
	t.Logf("idle mailbox (never used): %.0f bytes", per)
	if per > 2048 {
		t.Errorf("idle mailbox costs %.0f bytes, want < 2048", per)
	}
	per = idleBytesPerMailbox(t, n, true)
	t.Logf("idle mailbox (after handling one item): %.0f bytes", per)
	if per > 2048 {
		t.Errorf("idle used mailbox costs %.0f bytes, want < 2048", per)
	}
}

func idleBytesPerMailbox(tb testing.TB, n int, used bool) float64 {
	tb.Helper()
	handle := func(*int) {}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	boxes := make([]*mailbox.Mailbox[*int], n)
	for i := range boxes {
		m, err := mailbox.New(mailbox.Config[*int]{Handle: handle})
		if err != nil {
			tb.Fatal(err)
		}
		if used {
			if err := m.Post(nil); err != nil {
				tb.Fatal(err)
			}
		}
		boxes[i] = m
	}
	if used {
		for _, m := range boxes {
			if err := m.Drain(context.Background()); err != nil {
				tb.Fatal(err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
	for _, m := range boxes {
		m.Close()
	}
	runtime.KeepAlive(boxes)
	return per
}

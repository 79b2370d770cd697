package transport

import (
	"fmt"
	"github.com/meshnode/meshnode/internal/testutil"
	"math/rand"
	"sync"
	"testing"
	"time"
)

// gateCount is the gate's slots: free ones plus those held.
func gateCount(g *largeGate) (free, held, waiting int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.free, len(g.holders), len(g.waiting)
}

// Many lanes take and release a gate's two slots, some of them stalling
// (their sent stamp left old) so that waiting lanes take their slots
// over and their later release is a no-op. However they interleave, every
// take returns, and once all are done both slots are free and no lane
// waits: no slot leaks, none is counted twice.
func TestLargeGateKeepsItsSlotsThroughTakeoversAndReleases(t *testing.T) {
	const slots, lanes, rounds = 2, 12, 60
	g := newLargeGate(slots, 5*time.Millisecond)
	done := make(chan struct{})
	defer close(done)
	var wg sync.WaitGroup
	for i := 0; i < lanes; i++ {
		l := &lane{}
		l.packed = l.pack
		rng := rand.New(rand.NewSource(int64(i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				if !g.take(l, done) {
					t.Error("take refused while done is open")
					return
				}
				switch rng.Intn(4) {
				case 0: // stalled: nothing packed for longer than the stall (the time passing is what is tested)
					time.Sleep(8 * time.Millisecond)
				case 1: // steadily sending
					for k := 0; k < 3; k++ {
						l.packed(1200)
						time.Sleep(time.Millisecond)
					}
				}
				g.release(l)
			}
		}()
	}
	ok := make(chan struct{})
	go func() { wg.Wait(); close(ok) }()
	select {
	case <-ok:
	case <-time.After(30 * time.Second):
		free, held, waiting := gateCount(g)
		t.Fatalf("lanes still waiting for slots: free %d held %d waiting %d", free, held, waiting)
	}
	if free, held, waiting := gateCount(g); free != slots || held != 0 || waiting != 0 {
		t.Fatalf("after every lane released: free %d held %d waiting %d, want %d 0 0", free, held, waiting, slots)
	}
}

// Lanes waiting in line when the connection ends all return false and
// leave the line empty; the first of them too.
func TestLargeGateWaitersLeaveWhenTheConnectionEnds(t *testing.T) {
	g := newLargeGate(1, time.Hour)
	holder := &lane{}
	done := make(chan struct{})
	if !g.take(holder, done) {
		t.Fatal("first take refused")
	}
	var wg sync.WaitGroup
	res := make(chan bool, 5)
	for i := 0; i < 5; i++ {
		l := &lane{}
		wg.Add(1)
		go func() { defer wg.Done(); res <- g.take(l, done) }()
	}
	testutil.WaitFor(t, 10*time.Second, "five lanes in line", func() bool { _, _, w := gateCount(g); return w == 5 })
	close(done)
	wg.Wait()
	for i := 0; i < 5; i++ {
		if <-res {
			t.Fatal("a waiter got a slot held by a live holder")
		}
	}
	if _, _, w := gateCount(g); w != 0 {
		t.Fatalf("%d lanes left in line", w)
	}
}

// Lanes get a gate's only slot in the order they asked; the holder that
// releases and asks again at once comes after all of them, and a lane
// leaving the line (its connection ending) is skipped without a slot lost.
func TestLargeGateGrantsInOrderAndTheReleaserQueuesLast(t *testing.T) {
	g := newLargeGate(1, time.Hour)
	done := make(chan struct{})
	defer close(done)
	holder := &lane{}
	if !g.take(holder, done) {
		t.Fatal("first take refused")
	}
	order := make(chan int, 8)
	lanes := make([]*lane, 5)
	gone := make(chan struct{}) // lane 2's own end
	for i := range lanes {
		lanes[i] = &lane{}
		d := (<-chan struct{})(done)
		if i == 2 {
			d = gone
		}
		go func() {
			if g.take(lanes[i], d) {
				order <- i
			} else {
				order <- -i - 100
			}
		}()
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("lane %d in line", i), func() bool { _, _, w := gateCount(g); return w == i+1 })
	}
	close(gone)
	if got := <-order; got != -102 {
		t.Fatalf("lane 2 left the line with %d", got)
	}
	g.release(holder)
	again := make(chan bool, 1)
	go func() { again <- g.take(holder, done) }()
	var got []int
	for len(got) < 4 {
		select {
		case i := <-order:
			got = append(got, i)
			g.release(lanes[i])
		case <-again:
			t.Fatalf("the releaser got the slot back before lanes %v had theirs", got)
		case <-time.After(10 * time.Second):
			t.Fatalf("stuck after %v", got)
		}
	}
	if fmt.Sprint(got) != "[0 1 3 4]" {
		t.Fatalf("grant order %v, want [0 1 3 4]", got)
	}
	select {
	case <-again:
	case <-time.After(10 * time.Second):
		t.Fatal("the releaser never got the slot back")
	}
	if free, held, waiting := gateCount(g); free != 0 || held != 1 || waiting != 0 {
		t.Fatalf("free %d held %d waiting %d, want 0 1 0", free, held, waiting)
	}
}

// A stalled holder's slot goes to the first lane in line, not the second;
// the stalled holder's later release gives nothing back (the slot is the
// new holder's), and the second lane gets the slot once the first
// releases it.
func TestLargeGateTakeoverGoesToTheFirstInLine(t *testing.T) {
	const stall = 30 * time.Millisecond
	g := newLargeGate(1, stall)
	done := make(chan struct{})
	defer close(done)
	stalled, a, b := &lane{}, &lane{}, &lane{}
	if !g.take(stalled, done) {
		t.Fatal("first take refused")
	}
	got := make(chan *lane, 2)
	go func() { g.take(a, done); got <- a }()
	testutil.WaitFor(t, 5*time.Second, "a in line", func() bool { _, _, w := gateCount(g); return w == 1 })
	go func() { g.take(b, done); got <- b }()
	var first *lane
	select {
	case first = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover")
	}
	if first != a {
		t.Fatal("the second in line took the stalled holder's slot")
	}
	g.release(stalled) // its frame done at last: a no-op
	if free, held, waiting := gateCount(g); free != 0 || held != 1 || waiting != 1 {
		t.Fatalf("after the stalled holder's release: free %d held %d waiting %d, want 0 1 1", free, held, waiting)
	}
	// a keeps sending, so b may not take it over.
	stop := time.Now().Add(5 * stall)
	for time.Now().Before(stop) {
		a.packed = a.pack
		a.packed(100)
		select {
		case <-got:
			t.Fatal("b took a sending holder's slot")
		default:
		}
		time.Sleep(stall / 6) // a holder sending now and then: the time passing is what is tested
	}
	g.release(a)
	select {
	case l := <-got:
		if l != b {
			t.Fatal("wrong lane")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b never got the slot")
	}
	g.release(b)
	if free, held, waiting := gateCount(g); free != 1 || held != 0 || waiting != 0 {
		t.Fatalf("at the end: free %d held %d waiting %d, want 1 0 0", free, held, waiting)
	}
}

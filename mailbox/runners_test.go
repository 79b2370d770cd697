package mailbox_test

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
)

// goid is the calling goroutine's id, from its stack's first line.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// runnerGoroutines counts the goroutines that are runners, running a
// mailbox or parked.
func runnerGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("mailbox.(*Runners).loop"))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// goidMailbox is a mailbox on runners whose Handle sends its goroutine's
// id to ran, after waiting for gate when one is given.
func goidMailbox(t *testing.T, runners *mailbox.Runners, ran chan<- uint64, gate <-chan struct{}) *mailbox.Mailbox[int] {
	t.Helper()
	m, err := mailbox.New(mailbox.Config[int]{Runners: runners, Handle: func(int) {
		if gate != nil {
			<-gate
		}
		ran <- goid()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// A mailbox that starts runs on the runner the last idle mailbox parked,
// not on a new goroutine: another mailbox's Handle, and then its own
// again, see the same goroutine.
func TestMailboxesStartOnTheRunnerParkedLast(t *testing.T) {
	runners := mailbox.NewRunners(0)
	defer runners.Close()
	ran := make(chan uint64, 1)
	a, b := goidMailbox(t, runners, ran, nil), goidMailbox(t, runners, ran, nil)
	var ids []uint64
	for _, m := range []*mailbox.Mailbox[int]{a, b, a} {
		if err := m.Post(1); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, <-ran)
		testutil.WaitFor(t, 10*time.Second, "the runner parked", func() bool { return runners.Parked() == 1 })
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("handlers ran on goroutines %v, want one runner for all", ids)
	}
	// Without runners, each start is a goroutine of its own.
	c := goidMailbox(t, nil, ran, nil)
	var own []uint64
	for range 2 {
		if err := c.Post(1); err != nil {
			t.Fatal(err)
		}
		own = append(own, <-ran)
		testutil.WaitFor(t, 10*time.Second, "the mailbox idle", func() bool { return !c.Stats().Running })
	}
	if own[0] == own[1] {
		t.Fatalf("a mailbox without runners ran twice on goroutine %d", own[0])
	}
}

// At most Keep runners stay parked once the mailboxes they ran are idle;
// the others end, and Close ends the parked ones (goleak checks that no
// runner outlives the test).
func TestRunnersKeepAtMostKeepParked(t *testing.T) {
	const keep, busy = 2, 5
	runners := mailbox.NewRunners(keep)
	gate := make(chan struct{})
	ran := make(chan uint64, busy)
	for range busy {
		if err := goidMailbox(t, runners, ran, gate).Post(1); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "a runner for each busy mailbox", func() bool { return runnerGoroutines() == busy })
	close(gate)
	seen := map[uint64]bool{}
	for range busy {
		seen[<-ran] = true
	}
	if len(seen) != busy {
		t.Fatalf("%d busy mailboxes ran on %d goroutines", busy, len(seen))
	}
	testutil.WaitFor(t, 10*time.Second, "keep runners parked, the rest ended", func() bool {
		return runners.Parked() == keep && runnerGoroutines() == keep
	})
	runners.Close()
	if n := runners.Parked(); n != 0 {
		t.Fatalf("%d runners parked after Close", n)
	}
	testutil.WaitFor(t, 10*time.Second, "the parked runners ended", func() bool { return runnerGoroutines() == 0 })
}

// After Close, mailboxes still run: each start on a goroutine of its own,
// which nothing keeps.
func TestMailboxesRunAfterTheirRunnersClosed(t *testing.T) {
	runners := mailbox.NewRunners(0)
	runners.Close()
	ran := make(chan uint64, 1)
	m := goidMailbox(t, runners, ran, nil)
	for range 3 {
		if err := m.Post(1); err != nil {
			t.Fatal(err)
		}
		<-ran
		testutil.WaitFor(t, 10*time.Second, "the mailbox idle", func() bool { return !m.Stats().Running })
		if n := runners.Parked(); n != 0 {
			t.Fatalf("%d runners parked after Close", n)
		}
	}
}

// A Handle that ends its runner (runtime.Goexit) takes only that runner:
// the items behind it are handled on another, which parks after.
func TestHandleGoexitOnARunnerStillHandlesTheRest(t *testing.T) {
	runners := mailbox.NewRunners(0)
	defer runners.Close()
	var mu sync.Mutex
	var handled []int
	gate := make(chan struct{})
	m, err := mailbox.New(mailbox.Config[int]{Runners: runners, Handle: func(i int) {
		if i == 0 {
			<-gate
			runtime.Goexit()
		}
		mu.Lock()
		handled = append(handled, i)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i := range 4 {
		if err := m.Post(i); err != nil {
			t.Fatal(err)
		}
	}
	close(gate)
	testutil.WaitFor(t, 10*time.Second, "the items behind handled, their runner parked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 3 && runners.Parked() == 1
	})
	mu.Lock()
	defer mu.Unlock()
	for i, v := range handled {
		if v != i+1 {
			t.Fatalf("handled %v, want [1 2 3]", handled)
		}
	}
}

package partition

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// rulePeer is a receiver that keeps the stream rules (one watermark per
// recipient and epoch; DUPLICATE at or below it, OUT_OF_ORDER for a
// prev_sequence that is neither 0 nor the watermark) and, on every
// Deliver, checks the relay's invariant: nothing sent is at or above the
// lowest sequence of its stream still storing.
type rulePeer struct {
	r *Relay // set before Start

	mu        sync.Mutex
	down      map[string]bool
	wm        map[string]uint64
	ran       map[string][]*pb.Envelope // recipient
	runs      map[string]int            // type
	violation []string
}

func newRulePeer() *rulePeer {
	return &rulePeer{down: map[string]bool{}, wm: map[string]uint64{}, ran: map[string][]*pb.Envelope{}, runs: map[string]int{}}
}

func (p *rulePeer) Alive(node string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.down[node]
}

func (p *rulePeer) setDown(node string, down bool) {
	p.mu.Lock()
	p.down[node] = down
	p.mu.Unlock()
}

func (p *rulePeer) Deliver(_ context.Context, node string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	rcpt := envs[0].GetRecipient()
	if p.r != nil {
		if st := p.r.part(rcpt).lookup(rcpt); st != nil {
			st.mu.Lock()
			var lo uint64
			if len(st.storing) > 0 {
				lo = st.storing[0]
			}
			st.mu.Unlock()
			for _, e := range envs {
				if lo != 0 && e.GetSequence() >= lo {
					p.mu.Lock()
					p.violation = append(p.violation, fmt.Sprintf("%s: sent #%d while #%d is storing", rcpt, e.GetSequence(), lo))
					p.mu.Unlock()
				}
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down[node] {
		return nil, fmt.Errorf("peer %s unreachable", node)
	}
	rcs := make([]*pb.Receipt, len(envs))
	for i, e := range envs {
		k := fmt.Sprintf("%s\x00%d", e.GetRecipient(), e.GetStreamEpoch())
		w := p.wm[k]
		switch {
		case e.GetSequence() <= w:
			rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_DUPLICATE, Watermark: w}
		case e.GetPrevSequence() != 0 && e.GetPrevSequence() != w:
			rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_OUT_OF_ORDER, Watermark: w}
		default:
			p.wm[k] = e.GetSequence()
			p.ran[e.GetRecipient()] = append(p.ran[e.GetRecipient()], e)
			p.runs[e.GetType()]++
			rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: e.GetSequence()}
		}
	}
	return rcs, nil
}

func (p *rulePeer) runsOf(typ string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runs[typ]
}

func (p *rulePeer) violations() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.violation)
}

func (p *rulePeer) ranTypes(rcpt string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, e := range p.ran[rcpt] {
		out = append(out, e.GetType())
	}
	return out
}

// startedRelay is a started relay over a real store (in a temp dir, its
// path returned) and p, with parts partitions and short backoffs.
func startedRelay(t *testing.T, p *rulePeer, parts int) (*Relay, string) {
	t.Helper()
	r, path := newTestRelayConfig(t, p, nil, func(c *Config) {
		c.Partitions = parts
		c.Backoff = BackoffConfig{Base: time.Millisecond, Cap: 5 * time.Millisecond}
		c.DownRecheck = 20 * time.Millisecond
	})
	p.r = r
	r.Start()
	return r, path
}

// storingOf returns a copy of rcpt's storing list (nil: no stream).
func storingOf(r *Relay, rcpt string) []uint64 {
	st := r.part(rcpt).lookup(rcpt)
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Clone(st.storing)
}

// outcome of one message a test sent.
type sentMsg struct {
	typ, rcpt string
	g, i      int // producer, index
	ok        atomic.Int32
	failed    atomic.Int32
}

// checkAll waits for the queues to drain and checks that every message
// reported stored ran exactly once, none reported failed ran, each
// producer's messages to a recipient ran in call order, and the relay
// never sent above a sequence still storing.
func checkAll(t *testing.T, r *Relay, p *rulePeer, rcpts []string, sent []*sentMsg, failedMayRun bool) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, "queues drained and storing lists empty", func() bool {
		for _, rc := range rcpts {
			if r.store.Pending(rc) != 0 || len(storingOf(r, rc)) != 0 {
				return false
			}
		}
		return true
	})
	for _, s := range sent {
		ok, failed := s.ok.Load(), s.failed.Load()
		n := p.runsOf(s.typ)
		switch {
		case ok+failed != 1:
			t.Errorf("%s: callback ok %d, failed %d", s.typ, ok, failed)
		case ok == 1 && n != 1:
			t.Errorf("%s to %s reported stored, ran %d times", s.typ, s.rcpt, n)
		case failed == 1 && n != 0 && !failedMayRun:
			t.Errorf("%s to %s reported failed, ran %d times", s.typ, s.rcpt, n)
		}
	}
	for _, rc := range rcpts {
		last := map[int]int{}
		for _, typ := range p.ranTypes(rc) {
			var g, i int
			if _, err := fmt.Sscanf(typ[strings.IndexByte(typ, '/')+1:], "g%d-i%d", &g, &i); err != nil {
				continue
			}
			if prev, ok := last[g]; ok && prev >= i {
				t.Errorf("%s: producer %d's message %d ran after its %d", rc, g, i, prev)
			}
			last[g] = i
		}
	}
	if v := p.violations(); len(v) > 0 {
		t.Errorf("%d sends above a sequence still storing, first: %s", len(v), v[0])
	}
}

// sendAsync sends one message through SendAsync and records its outcome.
func sendAsync(t *testing.T, r *Relay, rcpt string, g, i int, cbs *sync.WaitGroup) *sentMsg {
	s := &sentMsg{typ: fmt.Sprintf("%s/g%d-i%d", rcpt, g, i), rcpt: rcpt, g: g, i: i}
	cbs.Add(1)
	err := r.SendAsync(context.Background(), message(rcpt, s.typ, 0), func(_ Sent, err error) {
		if err != nil {
			s.failed.Add(1)
		} else {
			s.ok.Add(1)
		}
		cbs.Done()
	})
	if err != nil {
		s.failed.Add(1)
		cbs.Done()
	}
	return s
}

// produce runs producers goroutines, each calling send for i from 0 to
// n-1, and returns every message they sent once all have returned.
func produce(producers, n int, send func(g, i int) *sentMsg) []*sentMsg {
	var mu sync.Mutex
	var sent []*sentMsg
	var wg sync.WaitGroup
	for g := range producers {
		wg.Go(func() {
			mine := make([]*sentMsg, 0, n)
			for i := range n {
				mine = append(mine, send(g, i))
			}
			mu.Lock()
			sent = append(sent, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return sent
}

// Several producers pipeline SendAsync to the same recipients (and to
// others between, so one commit's callbacks interleave streams): every
// message runs once, each producer's in call order, nothing is sent above
// a sequence still storing.
func TestPipelinedProducersToOneRecipientRunOnceInOrder(t *testing.T) {
	for _, parts := range []int{1, 4} {
		t.Run(fmt.Sprintf("parts=%d", parts), func(t *testing.T) {
			p := newRulePeer()
			r, _ := startedRelay(t, p, parts)
			rcpts := []string{"a@n1", "b@n1", "c@n2"}
			var cbs sync.WaitGroup
			sent := produce(6, 1500, func(g, i int) *sentMsg {
				rc := rcpts[0]
				if g%2 == 1 && i%3 != 0 {
					rc = rcpts[1+(i%2)]
				}
				return sendAsync(t, r, rc, g, i, &cbs)
			})
			cbs.Wait()
			checkAll(t, r, p, rcpts, sent, false)
		})
	}
}

// SendAsync, queued Send, direct Send and Store on one stream at once:
// doneStoring and doneStoringRun take from the same list.
func TestEveryKindOfSendOnOneStreamRunsOnceInOrder(t *testing.T) {
	p := newRulePeer()
	r, _ := startedRelay(t, p, 2)
	rcpts := []string{"a@n1", "b@n1"}
	var cbs sync.WaitGroup
	sent := produce(6, 600, func(g, i int) *sentMsg {
		rc := rcpts[(g+i)%2]
		if g%3 != 2 {
			return sendAsync(t, r, rc, g, i, &cbs)
		}
		s := &sentMsg{typ: fmt.Sprintf("%s/g%d-i%d", rc, g, i), rcpt: rc, g: g, i: i}
		var err error
		switch i % 3 {
		case 0:
			_, err = r.Send(context.Background(), message(rc, s.typ, 0), true)
		case 1:
			_, err = r.Send(context.Background(), message(rc, s.typ, 0), false)
		case 2:
			err = r.Store(context.Background(), []*pb.StoredMessage{message(rc, s.typ, 0)})[0]
		}
		if err != nil {
			s.failed.Add(1)
		} else {
			s.ok.Add(1)
		}
		return s
	})
	cbs.Wait()
	checkAll(t, r, p, rcpts, sent, false)
}

// Commits fail now and then (a full disk) while producers pipeline to the
// same recipient: what failed never runs, what was stored runs once and
// in order, and no sequence stays storing (the stream drains).
func TestFailedCommitsWhilePipeliningLeaveNoStreamStuck(t *testing.T) {
	p := newRulePeer()
	r, path := startedRelay(t, p, 1)
	rcpts := []string{"a@n1", "b@n1"}
	stop := make(chan struct{})
	var flip sync.WaitGroup
	flip.Go(func() {
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			restore, hits := faults.FailCommits(path, errDiskFull)
			testutil.Poll(time.Second, func() bool { return hits() > 0 })
			restore()
			// let a few commits through
			fs := r.store.Stats().Fsyncs
			testutil.Poll(time.Second, func() bool { return r.store.Stats().Fsyncs >= fs+uint64(1+k%3) })
		}
	})
	var cbs sync.WaitGroup
	sent := produce(4, 1500, func(g, i int) *sentMsg { return sendAsync(t, r, rcpts[(g/2+i%2)%2], g, i, &cbs) })
	cbs.Wait()
	close(stop)
	flip.Wait()
	var ok, failed int
	for _, s := range sent {
		ok += int(s.ok.Load())
		failed += int(s.failed.Load())
	}
	t.Logf("stored %d, failed %d", ok, failed)
	if failed == 0 {
		t.Log("no commit failed: the test did not exercise failures")
	}
	checkAll(t, r, p, rcpts, sent, false)
}

// Dead-letter replays of the recipient's stream run while producers
// pipeline to it (Reserve waits on the storing list).
func TestReplayWhilePipeliningRunsEveryMessageOnce(t *testing.T) {
	p := newRulePeer()
	r, _ := startedRelay(t, p, 1)
	rcpts := []string{"a@n1", "b@n1"}
	ctx := context.Background()
	var dead []*sentMsg
	for i := range 200 {
		rc := rcpts[i%2]
		s := &sentMsg{typ: fmt.Sprintf("%s/dead-%d", rc, i), rcpt: rc}
		sm := message(rc, s.typ, 0)
		seq, err := r.store.ReserveSequence()
		if err != nil {
			t.Fatal(err)
		}
		sm.Envelope.Sequence = seq
		if err := r.store.DeadLetter(ctx, sm, "rejected: test"); err != nil {
			t.Fatal(err)
		}
		s.ok.Add(1)
		dead = append(dead, s)
	}
	replayed := 0
	var replays sync.WaitGroup
	replays.Go(func() {
		for range 50 {
			n, err := r.store.Replay(outbox.DLQFilter{All: true, Limit: 4})
			if err != nil {
				t.Errorf("Replay: %v", err)
				return
			}
			replayed += n
		}
	})
	var cbs sync.WaitGroup
	sent := append(slices.Clone(dead), produce(4, 1500, func(g, i int) *sentMsg { return sendAsync(t, r, rcpts[(g+i)%2], g, i, &cbs) })...)
	replays.Wait()
	cbs.Wait()
	for {
		n, err := r.store.Replay(outbox.DLQFilter{All: true})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		replayed += n
	}
	if replayed != len(dead) {
		t.Fatalf("replayed %d of %d", replayed, len(dead))
	}
	checkAll(t, r, p, rcpts, sent, false)
}

// The peer goes down and comes back while producers pipeline to it.
func TestPipelinedSendsThroughAFlappingPeerRunOnceInOrder(t *testing.T) {
	p := newRulePeer()
	r, _ := startedRelay(t, p, 2)
	rcpts := []string{"a@n1", "b@n1", "c@n2"}
	stop := make(chan struct{})
	var flip sync.WaitGroup
	flip.Go(func() {
		for k := 0; ; k++ {
			select {
			case <-stop:
				p.setDown("n1", false)
				r.NodeAlive("n1")
				return
			default:
			}
			p.setDown("n1", true)
			d := r.Stats().Delivered
			testutil.Poll(20*time.Millisecond, func() bool { return r.Stats().Delivered > d+1000 })
			p.setDown("n1", false)
			r.NodeAlive("n1")
			d = r.Stats().Delivered
			testutil.Poll(50*time.Millisecond, func() bool { return r.Stats().Delivered > d+200 })
		}
	})
	var cbs sync.WaitGroup
	sent := produce(4, 2000, func(g, i int) *sentMsg { return sendAsync(t, r, rcpts[(g+i)%3], g, i, &cbs) })
	cbs.Wait()
	close(stop)
	flip.Wait()
	checkAll(t, r, p, rcpts, sent, false)
}

// Close while thousands of SendAsync are in flight: every accepted
// callback runs once, Close returns, nothing leaks (goleak in TestMain).
func TestCloseWithThousandsOfPipelinedSendsInFlight(t *testing.T) {
	for round := range 5 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			p := newRulePeer()
			r, _ := startedRelay(t, p, 2)
			var accepted, called, twice atomic.Int64
			var wg, cbs sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					for i := range 3000 {
						var once atomic.Bool
						cbs.Add(1)
						err := r.SendAsync(context.Background(), message(fmt.Sprintf("a%d@n1", (g+i)%3), "m", 0), func(Sent, error) {
							called.Add(1)
							if !once.CompareAndSwap(false, true) {
								twice.Add(1)
								return
							}
							cbs.Done()
						})
						if err != nil {
							cbs.Done()
							continue
						}
						accepted.Add(1)
					}
				})
			}
			testutil.WaitFor(t, 10*time.Second, "some in flight", func() bool { return accepted.Load() > int64(1000*(round+1)/2) })
			closed := make(chan struct{})
			go func() { _ = r.Close(); _ = r.store.Close(); close(closed) }()
			all := make(chan struct{})
			go func() { wg.Wait(); <-closed; cbs.Wait(); close(all) }()
			select {
			case <-all:
			case <-time.After(20 * time.Second):
				t.Fatalf("hang: accepted %d, called %d", accepted.Load(), called.Load())
			}
			if twice.Load() != 0 || called.Load() != accepted.Load() {
				t.Fatalf("accepted %d, callbacks %d (twice %d)", accepted.Load(), called.Load(), twice.Load())
			}
		})
	}
}

// Version 1 of a recipient's "state" is dead-lettered; version 2 is sent
// with SendAsync (behind a burst of other pipelined messages to the same
// recipient from other producers) while a Replay of version 1 runs. The
// last state run must be version 2 whenever version 2 was stored.
func TestReplayedOldVersionNeverLandsAboveAPipelinedNewerOne(t *testing.T) {
	d := &versionsPeer{entered: make(chan struct{}), refused: map[string]bool{}, ran: map[string][]string{}}
	r := newTestRelay(t, d)
	r.Start()
	ctx := context.Background()
	for i := range 150 {
		rcpt := fmt.Sprintf("a%d@n1", i)
		v := func(typ string) *pb.StoredMessage { return coalescedVersionTo(rcpt, typ, 0) }
		if sent, err := r.Send(ctx, v("v1"), true); err != nil || sent.Outcome != DeadLettered {
			t.Fatalf("Send(v1) = %+v, %v", sent, err)
		}
		var wg, cbs sync.WaitGroup
		for g := range 2 {
			wg.Go(func() {
				for j := range 50 {
					cbs.Add(1)
					if err := r.SendAsync(ctx, message(rcpt, fmt.Sprintf("f%d-%d", g, j), 0), func(Sent, error) { cbs.Done() }); err != nil {
						cbs.Done()
					}
				}
			})
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = r.store.Replay(outbox.DLQFilter{Recipient: rcpt})
		}()
		var v2err error
		cbs.Add(1)
		if err := r.SendAsync(ctx, v("v2"), func(_ Sent, err error) { v2err = err; cbs.Done() }); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		cbs.Wait()
		<-done
		if v2err != nil {
			t.Fatalf("v2: %v", v2err)
		}
		testutil.WaitFor(t, 10*time.Second, "drained", func() bool { return r.store.Pending(rcpt) == 0 && len(storingOf(r, rcpt)) == 0 })
		d.mu.Lock()
		var states []string
		for _, s := range d.ran[rcpt] {
			if s == "v1" || s == "v2" {
				states = append(states, s)
			}
		}
		d.mu.Unlock()
		if len(states) == 0 || states[len(states)-1] != "v2" {
			t.Fatalf("round %d: %s ran states %q: the stored version 2 was not the last state", i, rcpt, states)
		}
	}
}

// doneStoringRun leaves exactly what removing the run's sequences one by
// one (doneStoring) leaves, for random lists and runs: prefixes, shuffled
// runs, duplicates in the run, sequences not in the list.
func TestDoneStoringRunMatchesRemovingOneByOne(t *testing.T) {
	r := newTestRelay(t, nopDeliverer{})
	st, err := r.lockStream("a@n1")
	if err != nil {
		t.Fatal(err)
	}
	st.mu.Unlock()
	rnd := uint64(12345)
	next := func(n int) int {
		rnd ^= rnd << 13
		rnd ^= rnd >> 7
		rnd ^= rnd << 17
		return int(rnd % uint64(n))
	}
	for round := range 20000 {
		n := next(12)
		var list []uint64
		q := uint64(1 + next(3))
		for range n {
			list = append(list, q)
			q += uint64(1 + next(2))
		}
		var run []storedSeq
		k := next(n + 3)
		for j := range k {
			var s uint64
			switch next(4) {
			case 0, 1:
				if j < len(list) {
					s = list[j] // the front, in order
				} else {
					s = q + uint64(next(3))
				}
			case 2:
				if len(list) > 0 {
					s = list[next(len(list))]
				}
			default:
				s = uint64(next(int(q) + 2))
			}
			run = append(run, storedSeq{st, s})
		}
		want := slices.Clone(list)
		for _, s := range run {
			want = removeSeq(want, s.seq)
		}
		st.mu.Lock()
		st.storing = slices.Clone(list)
		st.mu.Unlock()
		r.doneStoringRun(st, run)
		st.mu.Lock()
		got := slices.Clone(st.storing)
		st.storing = nil
		st.mu.Unlock()
		if !slices.Equal(got, want) {
			seqs := make([]uint64, len(run))
			for i, s := range run {
				seqs[i] = s.seq
			}
			t.Fatalf("round %d: list %v, run %v: left %v, want %v", round, list, seqs, got, want)
		}
	}
}

package partition_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshnode/meshnode/internal/queued"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// wait bounds every poll of a test.
const wait = 10 * time.Second

// handler decides what the receiving actor's handler does with one message
// that the stream rules let through: nil or PROCESSED runs it.
type handler func(e *pb.Envelope) *pb.Receipt

func code(c pb.Receipt_Code, retryMs int64) handler {
	return func(e *pb.Envelope) *pb.Receipt {
		return &pb.Receipt{MsgId: e.GetMsgId(), Code: c, RetryAfterMs: retryMs, Message: "fake " + c.String()}
	}
}

// call is one Deliver the fake received.
type call struct {
	node string
	envs []*pb.Envelope
	err  error
	rcs  []*pb.Receipt
}

// fake is a Deliverer with a receiver behind it that keeps the stream
// rules as package node does: one watermark per (recipient, epoch);
// sequence <= watermark is DUPLICATE, a prev_sequence that is neither 0
// nor the watermark is OUT_OF_ORDER, else the handler runs and on success
// the watermark moves. Tests change liveness, handlers, or replace a whole
// Deliver (intercept) to lose, refuse or delay emissions.
type fake struct {
	// mu guards the fields below.
	mu        sync.Mutex
	down      map[string]bool    // node
	handlers  map[string]handler // recipient
	wm        map[string]uint64  // recipient NUL epoch
	digest    map[string]uint64  // recipient NUL epoch: pb.StreamDigest of the message that ran at wm, if one did here
	ran       map[string][]*pb.Envelope
	calls     []call
	inflight  map[string]int // recipient: Deliver calls in progress
	maxFlight map[string]int
	nodeMsgs  map[string]int // node: messages in Deliver calls in progress
	maxNode   map[string]int
	// intercept, when set, sees every Deliver first; it returns done to
	// answer the call itself with rcs and err.
	intercept func(ctx context.Context, n int, envs []*pb.Envelope) (rcs []*pb.Receipt, err error, done bool)
	// lane, when set, makes the fake a lane as the transport's: it says
	// when a call is queued (internal/queued), which lets the relay send a
	// stream's next emission early, and receives a recipient's calls in
	// the order they were queued (a held call holds those behind it).
	lane   bool
	queue  map[string][]int // recipient: calls queued and not yet received
	turned *sync.Cond       // on mu: a call left a queue
	// room, when set, is what each PROCESSED receipt says the recipient's
	// mailbox could take, each saying that nothing after its own message
	// had reached the mailbox yet (a receiver that keeps up).
	room uint32
}

func newFake() *fake {
	f := &fake{down: map[string]bool{}, handlers: map[string]handler{}, wm: map[string]uint64{}, digest: map[string]uint64{},
		ran: map[string][]*pb.Envelope{}, inflight: map[string]int{}, maxFlight: map[string]int{},
		nodeMsgs: map[string]int{}, maxNode: map[string]int{}, queue: map[string][]int{}}
	f.turned = sync.NewCond(&f.mu)
	return f
}

func (f *fake) Alive(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.down[node]
}

func (f *fake) Deliver(ctx context.Context, node string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	rcpt := envs[0].GetRecipient()
	f.mu.Lock()
	n := len(f.calls)
	f.calls = append(f.calls, call{node: node, envs: envs})
	f.inflight[rcpt]++
	f.maxFlight[rcpt] = max(f.maxFlight[rcpt], f.inflight[rcpt])
	f.nodeMsgs[node] += len(envs)
	f.maxNode[node] = max(f.maxNode[node], f.nodeMsgs[node])
	intercept, lane := f.intercept, f.lane
	if lane {
		f.queue[rcpt] = append(f.queue[rcpt], n)
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight[rcpt]--
		f.nodeMsgs[node] -= len(envs)
		if lane {
			f.queue[rcpt] = slices.DeleteFunc(f.queue[rcpt], func(c int) bool { return c == n })
			f.turned.Broadcast()
		}
		f.mu.Unlock()
	}()
	if lane {
		queued.Signal(ctx)
	}
	for _, e := range envs[1:] {
		if e.GetRecipient() != rcpt {
			panic("an emission mixes streams")
		}
	}
	var rcs []*pb.Receipt
	var err error
	done := false
	if intercept != nil {
		rcs, err, done = intercept(ctx, n, envs)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for lane && f.queue[rcpt][0] != n {
		f.turned.Wait()
	}
	if !done {
		if f.down[node] {
			rcs, err = nil, fmt.Errorf("fake: %s unreachable", node)
		} else {
			rcs = make([]*pb.Receipt, len(envs))
			for i, e := range envs {
				rcs[i] = f.receive(e)
			}
		}
	}
	f.calls[n].rcs, f.calls[n].err = rcs, err
	return rcs, err
}

// receive applies the stream rules and the handler to e. Caller holds mu.
func (f *fake) receive(e *pb.Envelope) *pb.Receipt {
	k := fmt.Sprintf("%s\x00%d", e.GetRecipient(), e.GetStreamEpoch())
	w := f.wm[k]
	// As a receiver does, a receipt of another message than the one at the
	// watermark says the digest of that one, when it ran here.
	var dg uint64
	if e.GetSequence() != w {
		dg = f.digest[k]
	}
	switch {
	case e.GetSequence() <= w:
		return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_DUPLICATE, Watermark: w, WatermarkDigest: dg}
	case e.GetPrevSequence() != 0 && e.GetPrevSequence() != w:
		return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_OUT_OF_ORDER, Watermark: w, WatermarkDigest: dg}
	}
	var rc *pb.Receipt
	if h := f.handlers[e.GetRecipient()]; h != nil {
		rc = h(e)
	}
	if rc == nil || rc.GetCode() == pb.Receipt_PROCESSED {
		f.wm[k], f.digest[k] = e.GetSequence(), pb.StreamDigest(e)
		f.ran[e.GetRecipient()] = append(f.ran[e.GetRecipient()], e)
		rc := &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: e.GetSequence()}
		if f.room > 0 {
			rc.Room, rc.Arrived = f.room, e.GetSequence()
		}
		return rc
	}
	return rc
}

func (f *fake) set(fn func(f *fake)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// ranTypes returns the Type of every message whose handler ran for
// recipient, in the order they ran.
func (f *fake) ranTypes(recipient string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.ran[recipient] {
		out = append(out, e.GetType())
	}
	return out
}

func (f *fake) ranCount(recipient string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ran[recipient])
}

func (f *fake) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fake) callsSnapshot() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// codes counts the receipt codes the fake answered with.
func (f *fake) codes() map[pb.Receipt_Code]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[pb.Receipt_Code]int{}
	for _, c := range f.calls {
		for _, rc := range c.rcs {
			if rc != nil {
				out[rc.GetCode()]++
			}
		}
	}
	return out
}

// rig is a relay over a real store in t.TempDir and a fake.
type rig struct {
	store *outbox.Store
	relay *partition.Relay
	fake  *fake
	path  string
	scfg  outbox.Config
}

// quiet drops the relay's warnings, which the tests provoke on purpose.
var quiet = slog.New(slog.DiscardHandler)

// fastBackoff keeps deferrals and retries in the milliseconds.
var fastBackoff = partition.BackoffConfig{Base: time.Millisecond, Cap: 5 * time.Millisecond}

// newRig opens a store and a relay (not started) over a fake; smut and
// rmut adjust their configs. Cleanup closes both.
func newRig(tb testing.TB, smut func(*outbox.Config), rmut func(*partition.Config)) *rig {
	tb.Helper()
	return newRigOver(tb, smut, rmut, nil)
}

// newRigOver is newRig whose relay delivers through over(the fake) (nil:
// the fake itself).
func newRigOver(tb testing.TB, smut func(*outbox.Config), rmut func(*partition.Config), over func(*fake) partition.Deliverer) *rig {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "outbox.db")
	scfg := outbox.DefaultConfig(path)
	scfg.LockTimeout = 200 * time.Millisecond
	scfg.Logger = quiet
	if smut != nil {
		smut(&scfg)
	}
	st, err := outbox.Open(scfg)
	if err != nil {
		tb.Fatal(err)
	}
	rg := &rig{store: st, fake: newFake(), path: path, scfg: scfg}
	rcfg := partition.DefaultConfig()
	rcfg.Backoff = fastBackoff
	rcfg.Logger = quiet
	if rmut != nil {
		rmut(&rcfg)
	}
	var d partition.Deliverer = rg.fake
	if over != nil {
		d = over(rg.fake)
	}
	rg.relay, err = partition.New(rcfg, st, d)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = rg.relay.Close()
		_ = rg.store.Close()
	})
	return rg
}

// msg is a message for recipient as package node builds one: everything
// but the sequence and the per-emission fields.
func (rg *rig) msg(recipient, typ string) *pb.StoredMessage {
	return &pb.StoredMessage{
		Envelope:         &pb.Envelope{Recipient: recipient, Sender: "app@n0", Type: typ, MsgId: typ},
		CreatedElapsedMs: rg.store.ElapsedMs(),
	}
}

// queue stores messages for recipient through the relay (no direct
// attempt), in order, in one commit.
func (rg *rig) queue(tb testing.TB, recipient string, typs ...string) {
	tb.Helper()
	sms := make([]*pb.StoredMessage, len(typs))
	for i, t := range typs {
		sms[i] = rg.msg(recipient, t)
	}
	rg.storeAll(tb, sms...)
}

// storeAll stores sms as queued messages, in order.
func (rg *rig) storeAll(tb testing.TB, sms ...*pb.StoredMessage) {
	tb.Helper()
	for i, err := range rg.relay.Store(context.Background(), sms) {
		if err != nil {
			tb.Fatalf("store %s: %v", sms[i].GetEnvelope().GetType(), err)
		}
	}
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

// stall blocks the store's committer until release: a CommitStream whose
// done waits, which the committer calls after its commit.
func stall(tb testing.TB, s *outbox.Store) (release func()) {
	tb.Helper()
	in, out := make(chan struct{}), make(chan struct{})
	s.CommitStream(&outbox.StreamCommit{Stream: []byte("stall"), Watermark: 1}, func(error) {
		close(in)
		<-out
	})
	select {
	case <-in:
	case <-time.After(wait):
		tb.Fatal("committer did not reach the stalling callback")
	}
	var once sync.Once
	release = func() { once.Do(func() { close(out) }) }
	tb.Cleanup(release)
	return release
}

// errUnreachable is what a lost emission reports.
var errUnreachable = errors.New("fake: connection reset")

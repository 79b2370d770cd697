package partition_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// behaviour decides the receipt of one message.
type behaviour func(e *pb.Envelope) *pb.Receipt

func processed(e *pb.Envelope) *pb.Receipt {
	return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED}
}

func code(c pb.Receipt_Code, retryMs int64) behaviour {
	return func(e *pb.Envelope) *pb.Receipt {
		return &pb.Receipt{MsgId: e.GetMsgId(), Code: c, RetryAfterMs: retryMs, Message: "fake"}
	}
}

// fake is a Deliverer: per-node liveness, a per-recipient behaviour
// (default PROCESSED), optional slowness, and a record of what it got.
type fake struct {
	// mu guards the fields below.
	mu      sync.Mutex
	down    map[string]bool
	behave  map[string]behaviour
	lose    map[string]bool // node: return nil receipts with an error
	got     map[string][]*pb.Envelope
	calls   int
	gate    chan struct{} // non-nil: Deliver waits for it (slow peer)
	maxConc map[string]int
	conc    map[string]int
}

func newFake() *fake {
	return &fake{down: map[string]bool{}, behave: map[string]behaviour{}, lose: map[string]bool{},
		got: map[string][]*pb.Envelope{}, maxConc: map[string]int{}, conc: map[string]int{}}
}

func (f *fake) Alive(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.down[node]
}

func (f *fake) Deliver(ctx context.Context, node string, msgs []*pb.Envelope) ([]*pb.Receipt, error) {
	f.mu.Lock()
	f.calls++
	f.conc[node] += len(msgs)
	f.maxConc[node] = max(f.maxConc[node], f.conc[node])
	gate := f.gate
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.conc[node] -= len(msgs)
		f.mu.Unlock()
	}()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down[node] || f.lose[node] {
		return nil, fmt.Errorf("fake: %s unreachable", node)
	}
	out := make([]*pb.Receipt, len(msgs))
	for i, e := range msgs {
		b := f.behave[e.GetRecipient()]
		if b == nil {
			b = processed
		}
		out[i] = b(e)
		if out[i].GetCode() == pb.Receipt_PROCESSED {
			f.got[e.GetRecipient()] = append(f.got[e.GetRecipient()], e)
		}
	}
	return out, nil
}

func (f *fake) set(fn func(f *fake)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// processedTypes returns the Type of every processed message of recipient.
func (f *fake) processedTypes(recipient string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.got[recipient] {
		out = append(out, e.GetType())
	}
	return out
}

func (f *fake) count(recipient string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.got[recipient])
}

type rig struct {
	store *outbox.Store
	relay *partition.Relay
	fake  *fake
	path  string
}

// newRig opens a store in tb.TempDir and a started relay over a fake.
func newRig(tb testing.TB, smut func(*outbox.Config), rmut func(*partition.Config)) *rig {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "outbox.db")
	scfg := outbox.DefaultConfig(path)
	scfg.Backoff = outbox.BackoffConfig{Base: time.Millisecond, Cap: 5 * time.Millisecond}
	if smut != nil {
		smut(&scfg)
	}
	st, err := outbox.Open(scfg)
	if err != nil {
		tb.Fatal(err)
	}
	rg := &rig{store: st, fake: newFake(), path: path}
	rcfg := partition.DefaultConfig()
	if rmut != nil {
		rmut(&rcfg)
	}
	rg.relay, err = partition.New(rcfg, st, rg.fake)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = rg.relay.Close()
		_ = rg.store.Close()
	})
	return rg
}

func (rg *rig) send(tb testing.TB, recipient string, bodies ...string) {
	tb.Helper()
	for _, b := range bodies {
		if err := rg.store.Enqueue(context.Background(), &pb.Envelope{Recipient: recipient, Type: b, MsgId: b}); err != nil {
			tb.Fatal(err)
		}
	}
}

func seq(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

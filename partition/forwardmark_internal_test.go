package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// heldPathPeer is a Router to the recipients' node with one forwarder, f,
// that takes every emission and brings no receipt back: it holds the copy
// in its queue to the recipient, and the copy runs when it arrives. While
// cut, the direct path leads nowhere; otherwise the recipient answers
// every direct copy with code, or, if unsendable, no copy can be put on
// the direct path (the peer's frame limit went down, as after its restart
// with a smaller one).
type heldPathPeer struct {
	code        pb.Receipt_Code
	unsendable  bool
	cut         atomic.Bool
	direct, via atomic.Int32
}

func newHeldPathPeer(code pb.Receipt_Code) *heldPathPeer {
	p := &heldPathPeer{code: code}
	p.cut.Store(true)
	return p
}

func (*heldPathPeer) Alive(string) bool { return true }
func (p *heldPathPeer) Deliver(_ context.Context, _ string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	if p.cut.Load() {
		return nil, fmt.Errorf("dial: %w", ErrUnreachable)
	}
	p.direct.Add(1)
	return directAnswer(envs, p.code, p.unsendable)
}
func (*heldPathPeer) Forwarders(string) []string { return []string{"f"} }

// directAnswer is the recipient's answer to every copy of envs sent on the
// direct path: code, or, if unsendable, none can be put on the wire (the
// peer's frame limit went down).
func directAnswer(envs []*pb.Envelope, code pb.Receipt_Code, unsendable bool) ([]*pb.Receipt, error) {
	if unsendable {
		errs := map[int]error{}
		for i := range envs {
			errs[i] = errors.New("larger than the peer's frame limit")
		}
		return nil, &UnsendableError{Errs: errs}
	}
	rcs := make([]*pb.Receipt, len(envs))
	for i, e := range envs {
		rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: code, Message: "the recipient's answer"}
	}
	return rcs, nil
}
func (p *heldPathPeer) DeliverVia(_ context.Context, _, node string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	p.via.Add(1)
	return make([]*pb.Receipt, len(envs)), fmt.Errorf("f brought no receipt from %s", node)
}
func (p *heldPathPeer) Probe(context.Context, string) error {
	if p.cut.Load() {
		return ErrUnreachable
	}
	return nil
}

// forwardRun opens the outbox at path (smut edits its config) and makes a
// relay over it that forwards (after one failed emission) or not; opened,
// if not nil, is called in between. Closing it closes both.
type forwardRun struct {
	s *outbox.Store
	r *Relay
}

func openForwardRun(t *testing.T, path string, d Deliverer, forwards bool, smut func(*outbox.Config), opened func()) *forwardRun {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	scfg := outbox.DefaultConfig(path)
	scfg.Logger = quiet
	if smut != nil {
		smut(&scfg)
	}
	s, err := outbox.Open(scfg)
	if err != nil {
		t.Fatal(err)
	}
	if opened != nil {
		opened()
	}
	cfg := DefaultConfig()
	cfg.Partitions, cfg.Logger = 1, quiet
	cfg.Backoff = BackoffConfig{Base: time.Millisecond, Cap: 5 * time.Millisecond}
	cfg.Forward = ForwardConfig{} // off
	if forwards {
		cfg.Forward = ForwardConfig{After: 1, Probe: 20 * time.Millisecond}
	}
	r, err := New(cfg, s, d)
	if err != nil {
		_ = s.Close()
		t.Fatal(err)
	}
	run := &forwardRun{s: s, r: r}
	t.Cleanup(run.close)
	return run
}

func (run *forwardRun) close() {
	_ = run.r.Close()
	_ = run.s.Close()
}

// deadLetters waits for n dead letters of rcpt and returns their reasons
// by message type.
func (run *forwardRun) deadLetters(t *testing.T, rcpt string, n int) map[string]string {
	t.Helper()
	var dl []outbox.DeadLetter
	var err error
	testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%d dead letters", n), func() bool {
		dl, err = run.s.DeadLetters(outbox.DLQFilter{Recipient: rcpt})
		return err == nil && len(dl) == n
	})
	reasons := map[string]string{}
	for _, d := range dl {
		reasons[d.Message.GetEnvelope().GetType()] = d.Reason
	}
	return reasons
}

// A run sends message a through a forwarder that brings no receipt back
// (it may hold the copy). The node restarts with forwarding turned off, as
// an operator may during the very incident that made it forward, stores b,
// and restarts again, still without. When the recipient answers a's direct
// copy EXPIRED, the held copy may still run: a's dead letter says its
// outcome is unknown, which it said only when the run judging it forwarded
// itself (so "expired", which says no copy can run, invited a replay that
// ran it twice). b, stored by a run that forwarded nothing, never went
// through a forwarder: its dead letter says "expired".
func TestRunsWithoutForwardingRememberWhatAnEarlierRunForwarded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	held := newHeldPathPeer(pb.Receipt_EXPIRED)
	run1 := openForwardRun(t, path, held, true, nil, nil)
	run1.r.Start()
	if _, err := run1.r.Send(context.Background(), message("a@n1", "a", time.Hour.Milliseconds()), false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "a sent through the forwarder", func() bool { return held.via.Load() > 0 })
	run1.close()

	run2 := openForwardRun(t, path, held, false, nil, nil)
	storeMsgs(t, run2.r, message("a@n1", "b", time.Hour.Milliseconds()))
	run2.close()

	held.cut.Store(false) // reached directly: every copy is answered EXPIRED
	run3 := openForwardRun(t, path, held, false, nil, nil)
	run3.r.Start()
	reasons := run3.deadLetters(t, "a@n1", 2)
	if reasons["a"] != outbox.ReasonExpiredUnknown {
		t.Errorf("a, sent through a forwarder two runs ago with no answer, dead-lettered %q; want %q (the forwarder may still hold a copy that runs)", reasons["a"], outbox.ReasonExpiredUnknown)
	}
	if reasons["b"] != outbox.ReasonExpired {
		t.Errorf("b, stored by a run that forwarded nothing and never sent before, dead-lettered %q; want %q", reasons["b"], outbox.ReasonExpired)
	}
}

// An operator restores outbox.db alone from a backup, keeping
// outbox.db.seq beside it (the way the README gives). The backup was taken
// while message a was queued and before any run forwarded; after it, a run
// sent a through a forwarder that brought no answer (it may hold the
// copy). The restored file does not know that run forwarded, but the
// sequences recorded beside it show that it is older than the runs since:
// everything in it counts as possibly forwarded, and a's EXPIRED answer
// dead-letters it "outcome unknown", not "expired" (never ran).
func TestAnOutboxRestoredFromABackupCountsItsMessagesAsPossiblyForwarded(t *testing.T) {
	dir := t.TempDir()
	path, backup := filepath.Join(dir, "outbox.db"), filepath.Join(dir, "backup.db")
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		if err == nil {
			err = os.WriteFile(to, b, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	held := newHeldPathPeer(pb.Receipt_EXPIRED)
	run0 := openForwardRun(t, path, held, false, nil, nil)
	storeMsgs(t, run0.r, message("a@n1", "a", time.Hour.Milliseconds()))
	run0.close()
	copyFile(path, backup)

	run1 := openForwardRun(t, path, held, true, nil, nil)
	run1.r.Start()
	testutil.WaitFor(t, 10*time.Second, "a sent through the forwarder", func() bool { return held.via.Load() > 0 })
	run1.close()

	copyFile(backup, path)
	held.cut.Store(false) // reached directly: every copy is answered EXPIRED
	run2 := openForwardRun(t, path, held, false, nil, nil)
	run2.r.Start()
	if reason := run2.deadLetters(t, "a@n1", 1)["a"]; reason != outbox.ReasonExpiredUnknown {
		t.Fatalf("a, sent through a forwarder after the backup the outbox was restored from, dead-lettered %q; want %q (the forwarder may still hold a copy that runs)", reason, outbox.ReasonExpiredUnknown)
	}
}

// A message with no TTL that went through a forwarder bringing no answer
// (it may hold the copy) is given up when its age passes MaxAge: its
// reason says the outcome is unknown, since the held copy may still run.
func TestTooOldWithACopyHeldAtAForwarderIsOutcomeUnknown(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	held := newHeldPathPeer(pb.Receipt_PROCESSED) // cut: the direct path leads nowhere
	run := openForwardRun(t, filepath.Join(t.TempDir(), "outbox.db"), held, true, func(c *outbox.Config) {
		c.Clock = clk
		c.StreamRetention, c.RetentionMargin = 10*time.Hour, 2*time.Hour // MaxAge 8 h
	}, nil)
	run.r.Start()
	if _, err := run.r.Send(context.Background(), message("a@n1", "m", 0), false); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "a copy sent through the forwarder", func() bool {
		clk.Advance(20 * time.Millisecond) // backoffs run on the outbox's clock
		return held.via.Load() > 0
	})
	clk.Advance(8*time.Hour + time.Minute)
	if reason := run.deadLetters(t, "a@n1", 1)["m"]; reason != outbox.ReasonTooOldUnknown {
		t.Fatalf("dead letter reason %q (copies through the forwarder %d, none answered); want %q: the forwarder may still hold a copy that runs", reason, held.via.Load(), outbox.ReasonTooOldUnknown)
	}
}

// A copy of a message went through a forwarder that brought no answer (it
// may hold the copy); then the direct path comes back and the recipient's
// handler fails or refuses the next copy until it is dead-lettered, or the
// copy cannot be put on the direct path at all. The
// held copy may still run when it arrives (the actor spawned, the
// handler's dependency back), so the dead letter may have run: its reason
// says the outcome is unknown, as an expiry's does, or a replay of it,
// taken for one that never ran, can run the message twice.
func TestFailureWithACopyHeldAtAForwarderIsOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		name       string
		code       pb.Receipt_Code
		unsendable bool
		prefix     string
	}{
		{"handler failed", pb.Receipt_TRANSIENT, false, "max attempts: "},
		{"no such actor", pb.Receipt_NO_SUCH_ACTOR, false, "max attempts: no such actor: "},
		{"rejected", pb.Receipt_REJECTED, false, "rejected: "},
		{"cannot be sent directly", pb.Receipt_PROCESSED, true, "rejected: cannot be sent: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held := newHeldPathPeer(tc.code)
			held.unsendable = tc.unsendable
			run := openForwardRun(t, filepath.Join(t.TempDir(), "outbox.db"), held, true, func(c *outbox.Config) { c.MaxAttempts = 1 }, nil)
			run.r.Start()
			if _, err := run.r.Send(context.Background(), message("a@n1", "m", 0), false); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, 10*time.Second, "a copy sent through the forwarder", func() bool { return held.via.Load() > 0 })
			held.cut.Store(false)
			reason := run.deadLetters(t, "a@n1", 1)["m"]
			if !strings.HasPrefix(reason, tc.prefix) || !strings.HasSuffix(reason, outbox.OutcomeUnknownForwarded) {
				t.Fatalf("dead letter reason %q (direct copies %d, through f %d); want %q…%q: a copy sent through the forwarder got no answer and may still run",
					reason, held.direct.Load(), held.via.Load(), tc.prefix, outbox.OutcomeUnknownForwarded)
			}
		})
	}
}

// lostThenRefusingPeer is the recipients' node reached directly (no
// forwarder). The first copy it is sent reaches the recipient, which runs
// it, but its receipt is lost (the connection reset before it came back).
// Every later copy is answered code (the actor stopped: NO_SUCH_ACTOR from
// a receiver that does not look at the stream first), or, if unsendable,
// cannot be put on the wire (the peer restarted with a smaller frame
// limit).
type lostThenRefusingPeer struct {
	code       pb.Receipt_Code
	unsendable bool
	ran, calls atomic.Int32
}

func (*lostThenRefusingPeer) Alive(string) bool { return true }
func (p *lostThenRefusingPeer) Deliver(_ context.Context, _ string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	if p.calls.Add(1) == 1 {
		p.ran.Add(int32(len(envs)))
		return make([]*pb.Receipt, len(envs)), errors.New("connection reset: no receipt")
	}
	return directAnswer(envs, p.code, p.unsendable)
}

// A copy of a message went on the direct path and got no receipt (it ran;
// the receipt was lost). A later failure that does not say whether that
// copy ran (no such actor, or a copy that cannot be put on the wire)
// dead-letters the message with a reason that says its outcome is
// unknown: the note was added only for copies sent through a forwarder,
// so the dead letter read as one that never ran, and a replay ran it
// twice.
func TestFailureAfterAnUnansweredDirectCopyIsOutcomeUnknown(t *testing.T) {
	for _, tc := range []struct {
		name   string
		peer   *lostThenRefusingPeer
		prefix string
	}{
		{"no such actor", &lostThenRefusingPeer{code: pb.Receipt_NO_SUCH_ACTOR}, "max attempts: no such actor: "},
		{"cannot be sent", &lostThenRefusingPeer{unsendable: true}, "rejected: cannot be sent: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := openForwardRun(t, filepath.Join(t.TempDir(), "outbox.db"), tc.peer, false, func(c *outbox.Config) { c.MaxAttempts = 1 }, nil)
			run.r.Start()
			if _, err := run.r.Send(context.Background(), message("a@n1", "m", time.Hour.Milliseconds()), false); err != nil {
				t.Fatal(err)
			}
			reason := run.deadLetters(t, "a@n1", 1)["m"]
			if !strings.HasPrefix(reason, tc.prefix) || !strings.HasSuffix(reason, outbox.OutcomeUnknownSent) {
				t.Fatalf("dead-lettered %q after a copy went out with no receipt (the recipient ran it %d time(s)); want %q…%q", reason, tc.peer.ran.Load(), tc.prefix, outbox.OutcomeUnknownSent)
			}
		})
	}
}

// A relay configured to forward whose outbox cannot record that it does
// (the disk refuses the commit) does not forward in this run: a later run
// would not know that its messages may be held at a forwarder. It takes
// every message stored before it for one an earlier run may have
// forwarded.
func TestARelayThatCannotRecordThatItForwardsSendsDirectOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	var full atomic.Bool
	restore := faults.FailWrites(path, errDiskFull, func(meta bool) bool { return !meta && full.Load() })
	defer restore()
	held := newHeldPathPeer(pb.Receipt_EXPIRED)
	run := openForwardRun(t, path, held, true, nil, func() { full.Store(true) })
	full.Store(false)
	if run.r.routes.rt != nil {
		t.Fatal("the relay forwards although its outbox refused to record that it does")
	}
	if run.r.runFloor != math.MaxUint64 {
		t.Fatalf("runFloor = %d; want every message stored before the run counted as possibly forwarded", run.r.runFloor)
	}
}

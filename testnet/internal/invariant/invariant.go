// Package invariant checks what reliable senders were told against what
// receivers processed: nothing acknowledged is lost, nothing runs twice in
// one receiver incarnation, per-(sender, recipient) order holds, and every
// message that was not processed is in a dead-letter queue for a reason it
// deserves (poison, or expired), never because it was healthy.
//
// It knows nothing of nodes: senders and receivers describe messages with
// strings (sender node, recipient address) and a sequence number the
// Recorder hands out per (sender, recipient), in send order. The three name
// a message; idempotency keys are optional and informational.
package invariant

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshnode/meshnode/internal/address"
)

// Outcome is what a sender was told.
type Outcome int

const (
	// Delivered: the recipient's handler succeeded.
	Delivered Outcome = iota + 1
	// Queued: fsynced in the sender's outbox.
	Queued
	// DeadLettered: the direct attempt's verdict was final; it is in the
	// sender's dead-letter queue.
	DeadLettered
	// Failed: the send returned an error; nothing was promised.
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "Delivered"
	case Queued:
		return "Queued"
	case DeadLettered:
		return "DeadLettered"
	case Failed:
		return "Failed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Sent is one logical message as its sender saw it.
type Sent struct {
	Sender    string // sender node
	Recipient string // actor@node
	Seq       uint64 // from Recorder.Next: send order per (Sender, Recipient)
	Key       string // idempotency key, if one was given
	Poison    bool   // the handler refuses it as poison: it belongs in a DLQ
	TTL       bool   // sent with a TTL: it may expire
	Outcome   Outcome
	Err       error // when Failed
}

// Processed is one run of a recipient's handler that returned nil.
type Processed struct {
	Sender    string // sender node, as the receiver verified it
	Recipient string // actor@node
	Seq       uint64
	Key       string
	Boot      string        // the receiving node's incarnation (boot id)
	Stream    string        // the stream it came in (for reports: a re-run in another epoch says why)
	Wire      uint64        // its sequence in that stream
	At        time.Duration // the receiving node's clock when it ran (SetClock), 0 if unknown
}

// Dead is one dead-letter queue entry.
type Dead struct {
	Sender    string // the node whose dead-letter queue holds it
	Recipient string
	Seq       uint64
	Reason    string
}

// msgID names a logical message.
type msgID struct {
	sender, recipient string
	seq               uint64
}

func (m msgID) String() string { return fmt.Sprintf("%s -> %s #%d", m.sender, m.recipient, m.seq) }

// Recorder collects Sent and Processed records from many goroutines.
type Recorder struct {
	seed int64

	// mu guards the fields below.
	mu        sync.Mutex
	next      map[[2]string]uint64
	sent      []Sent
	processed []Processed
	crashed   map[string]bool // boot ids of incarnations that were killed
	clocks    map[string]func() time.Duration
}

// NewRecorder returns an empty Recorder; the random seed is printed by every Report
// so a failure can be reproduced.
func NewRecorder(seed int64) *Recorder {
	return &Recorder{seed: seed, next: make(map[[2]string]uint64), crashed: make(map[string]bool)}
}

// Next returns the next sequence for (sender, recipient), starting at 1.
// Call it in send order: one goroutine per pair.
func (r *Recorder) Next(sender, recipient string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := [2]string{sender, recipient}
	r.next[k]++
	return r.next[k]
}

// Sent records what a sender was told.
func (r *Recorder) Sent(s Sent) {
	r.mu.Lock()
	r.sent = append(r.sent, s)
	r.mu.Unlock()
}

// Processed records a handler run that succeeded.
func (r *Recorder) Processed(p Processed) {
	r.mu.Lock()
	if _, node, ok := address.Split(p.Recipient); ok && r.clocks[node] != nil {
		p.At = r.clocks[node]()
	}
	r.processed = append(r.processed, p)
	r.mu.Unlock()
}

// SetClock gives node's clock: each run it processes is stamped with it,
// so a report can say how much time lay between two runs.
func (r *Recorder) SetClock(node string, now func() time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.clocks == nil {
		r.clocks = make(map[string]func() time.Duration)
	}
	r.clocks[node] = now
}

// Crashed marks a receiver incarnation as killed: a key it processed may be
// processed again by the next incarnation (the handler ran, the crash came
// before its key was durable), which the checker reports apart from real
// duplicates.
func (r *Recorder) Crashed(boot string) {
	r.mu.Lock()
	r.crashed[boot] = true
	r.mu.Unlock()
}

// Counts returns how many sends and handler runs were recorded.
func (r *Recorder) Counts() (sent, processed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sent), len(r.processed)
}

// ProcessedMessages returns the number of distinct messages processed.
func (r *Recorder) ProcessedMessages() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := make(map[msgID]bool)
	for _, p := range r.processed {
		seen[msgID{p.Sender, p.Recipient, p.Seq}] = true
	}
	return len(seen)
}

// Report is the checker's verdict.
type Report struct {
	Seed                                  int64
	Sent, Delivered, Queued, DeadLettered int // logical messages and their outcomes
	Failed                                int
	Processed                             int // handler runs
	InDLQ                                 int // acknowledged messages found in a DLQ for a reason they deserve
	RanOutcomeUnknown                     int // messages that ran and are in a DLQ with a reason saying "outcome unknown"
	Lost                                  []string
	Duplicates                            []string
	CrashWindowDuplicates                 []string // allowed: first run on an incarnation that was killed
	OrderViolations                       []string
	DeadWithoutReason                     []string
	HealthyDeadLettered                   []string // in a DLQ though neither poison nor expired
	Unexpected                            []string // processed but never sent, or poison that ran
	// RanYetDeadLettered: a handler ran the message, yet its dead letter
	// does not say "outcome unknown": an operator takes it for one that
	// never ran, and a replay runs it again.
	RanYetDeadLettered []string
	// CrashWindowRanYetDeadLettered: allowed: the runs were all on
	// incarnations that were killed before they recorded them.
	CrashWindowRanYetDeadLettered []string
}

// OK reports whether every invariant holds.
func (r Report) OK() bool {
	return len(r.Lost) == 0 && len(r.Duplicates) == 0 && len(r.OrderViolations) == 0 &&
		len(r.DeadWithoutReason) == 0 && len(r.HealthyDeadLettered) == 0 && len(r.Unexpected) == 0 &&
		len(r.RanYetDeadLettered) == 0
}

// Err returns nil when OK, else an error carrying the summary and the random seed.
func (r Report) Err() error {
	if r.OK() {
		return nil
	}
	return fmt.Errorf("invariant: violated (seed %d):\n%s", r.Seed, r.String())
}

// String is a summary with the first few examples of each violation.
func (r Report) String() string {
	var b strings.Builder
	r.Write(&b)
	return b.String()
}

// Write prints the summary to w.
func (r Report) Write(w io.Writer) {
	fmt.Fprintf(w, "seed %d: sent %d (delivered %d, queued %d, dead-lettered %d, failed %d), handler runs %d, in a DLQ for a reason %d (of which ran, outcome unknown: %d)\n",
		r.Seed, r.Sent, r.Delivered, r.Queued, r.DeadLettered, r.Failed, r.Processed, r.InDLQ, r.RanOutcomeUnknown)
	list := func(what string, xs []string) {
		fmt.Fprintf(w, "  %-38s %d\n", what, len(xs))
		for i, x := range xs {
			if i == 5 {
				fmt.Fprintf(w, "    ... %d more\n", len(xs)-5)
				break
			}
			fmt.Fprintf(w, "    %s\n", x)
		}
	}
	list("acknowledged lost:", r.Lost)
	list("duplicate runs:", r.Duplicates)
	list("order violations:", r.OrderViolations)
	list("dead letters w/o reason:", r.DeadWithoutReason)
	list("healthy dead-lettered:", r.HealthyDeadLettered)
	list("unexpected runs:", r.Unexpected)
	list("ran, dead letter says not:", r.RanYetDeadLettered)
	list("crash-window re-runs (ok):", r.CrashWindowDuplicates)
	list("crash-window runs dead-lettered (ok):", r.CrashWindowRanYetDeadLettered)
}

// deserved reports whether a dead letter's reason is one the message
// deserves: poison refused by its handler, or expired (its TTL, or the
// retention limit every message has).
func deserved(s Sent, reason string) bool {
	switch {
	case strings.HasPrefix(reason, "expired: older than"):
		return true
	case strings.HasPrefix(reason, "expired"):
		return s.TTL
	case strings.HasPrefix(reason, "rejected"):
		return s.Poison
	}
	return false
}

// Check compares the records with the dead-letter queues of every sender.
func (r *Recorder) Check(dead []Dead) Report {
	r.mu.Lock()
	sent := slices.Clone(r.sent)
	processed := slices.Clone(r.processed)
	crashed := make(map[string]bool, len(r.crashed))
	for k, v := range r.crashed {
		crashed[k] = v
	}
	r.mu.Unlock()

	rep := Report{Seed: r.seed, Sent: len(sent), Processed: len(processed)}
	runs := make(map[msgID][]Processed)
	for _, p := range processed {
		k := msgID{p.Sender, p.Recipient, p.Seq}
		runs[k] = append(runs[k], p)
	}
	deadBy := make(map[msgID]Dead)
	for _, d := range dead {
		deadBy[msgID{d.Sender, d.Recipient, d.Seq}] = d
	}
	sentBy := make(map[msgID]Sent, len(sent))
	for _, s := range sent {
		k := msgID{s.Sender, s.Recipient, s.Seq}
		sentBy[k] = s
		switch s.Outcome {
		case Delivered:
			rep.Delivered++
		case Queued:
			rep.Queued++
		case DeadLettered:
			rep.DeadLettered++
		default:
			rep.Failed++
		}
		d, isDead := deadBy[k]
		if isDead && len(runs[k]) > 0 && strings.Contains(d.Reason, "outcome unknown") {
			rep.RanOutcomeUnknown++
		} else if isDead && len(runs[k]) > 0 && d.Reason != "" {
			msg := fmt.Sprintf("%s ran %d times, dead letter %q", k, len(runs[k]), d.Reason)
			if !slices.ContainsFunc(runs[k], func(p Processed) bool { return !crashed[p.Boot] }) {
				rep.CrashWindowRanYetDeadLettered = append(rep.CrashWindowRanYetDeadLettered, msg)
			} else {
				rep.RanYetDeadLettered = append(rep.RanYetDeadLettered, msg)
			}
		}
		if isDead {
			switch {
			case d.Reason == "":
				rep.DeadWithoutReason = append(rep.DeadWithoutReason, k.String())
			case !deserved(s, d.Reason):
				rep.HealthyDeadLettered = append(rep.HealthyDeadLettered, fmt.Sprintf("%s: %q", k, d.Reason))
			case s.Outcome != Failed:
				rep.InDLQ++
			}
		}
		if s.Outcome == Failed || len(runs[k]) > 0 || isDead {
			continue
		}
		rep.Lost = append(rep.Lost, fmt.Sprintf("%s (%s)", k, s.Outcome))
	}
	for k, rs := range runs {
		s, ok := sentBy[k]
		switch {
		case !ok:
			rep.Unexpected = append(rep.Unexpected, k.String()+": never sent")
		case s.Poison:
			rep.Unexpected = append(rep.Unexpected, k.String()+": poison, yet its handler succeeded")
		}
		for i := 1; i < len(rs); i++ {
			msg := fmt.Sprintf("%s run %d of %d", k, i+1, len(rs))
			if rs[i-1].Stream != rs[i].Stream {
				msg += fmt.Sprintf(" (streams %s, then %s)", rs[i-1].Stream, rs[i].Stream)
			}
			msg += fmt.Sprintf(" [wire sequence %d, then %d", rs[i-1].Wire, rs[i].Wire)
			if rs[i-1].At != 0 && rs[i].At != 0 {
				msg += fmt.Sprintf(", %v apart on the receiver's clock", rs[i].At-rs[i-1].At)
			}
			msg += "]"
			if crashed[rs[i-1].Boot] && rs[i-1].Boot != rs[i].Boot {
				rep.CrashWindowDuplicates = append(rep.CrashWindowDuplicates, msg)
			} else {
				rep.Duplicates = append(rep.Duplicates, msg)
			}
		}
	}
	// Order: the first run of each message, per (sender, recipient), must
	// come in increasing sequence. Re-runs are duplicates, not reorders;
	// gaps are messages given up (poison, expired) or never promised.
	type pair struct{ sender, recipient string }
	last := make(map[pair]uint64)
	first := make(map[msgID]bool)
	for _, p := range processed {
		k := msgID{p.Sender, p.Recipient, p.Seq}
		if first[k] {
			continue
		}
		first[k] = true
		pk := pair{p.Sender, p.Recipient}
		if p.Seq < last[pk] {
			rep.OrderViolations = append(rep.OrderViolations,
				fmt.Sprintf("%s -> %s: seq %d processed after seq %d", p.Sender, p.Recipient, p.Seq, last[pk]))
			continue
		}
		last[pk] = p.Seq
	}
	slices.Sort(rep.Lost)
	slices.Sort(rep.Duplicates)
	slices.Sort(rep.CrashWindowDuplicates)
	slices.Sort(rep.Unexpected)
	slices.Sort(rep.HealthyDeadLettered)
	slices.Sort(rep.RanYetDeadLettered)
	slices.Sort(rep.CrashWindowRanYetDeadLettered)
	return rep
}

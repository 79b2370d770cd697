// Package invariant checks what reliable senders were told against what
// receivers processed: nothing acknowledged is lost, keyed messages take
// effect once, per-(sender, recipient) order holds, and every message that
// was not processed is in a dead-letter queue with a reason.
//
// It knows nothing of nodes: senders and receivers describe messages with
// strings (sender node, recipient address, idempotency key) and a sequence
// number the Recorder hands out per (sender, recipient), in send order.
package invariant

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
)

// Outcome is what a sender was told.
type Outcome int

const (
	// Delivered: the recipient's handler succeeded.
	Delivered Outcome = iota + 1
	// Queued: fsynced in the sender's outbox.
	Queued
	// Failed: the send returned an error; nothing was promised.
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "Delivered"
	case Queued:
		return "Queued"
	case Failed:
		return "Failed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Sent is one logical message as its sender saw it.
type Sent struct {
	Sender    string // sender node
	Recipient string // actor@node
	Key       string // idempotency key; unique per logical message
	Seq       uint64 // from Recorder.Next: send order per (Sender, Recipient)
	Outcome   Outcome
	Err       error // when Failed
}

// Processed is one run of a recipient's handler that returned nil.
type Processed struct {
	Sender    string // sender node, from the envelope
	Recipient string // actor@node
	Key       string
	Seq       uint64
	Boot      string // the receiving node's incarnation (boot id)
}

// Dead is one dead-letter queue entry.
type Dead struct {
	Recipient string
	Key       string
	Reason    string
}

// Recorder collects Sent and Processed records from many goroutines.
type Recorder struct {
	seed int64

	// mu guards the fields below.
	mu        sync.Mutex
	next      map[[2]string]uint64
	sent      []Sent
	processed []Processed
	crashed   map[string]bool // boot ids of incarnations that were killed
}

// NewRecorder returns an empty Recorder; seed is printed by every Report
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
	r.processed = append(r.processed, p)
	r.mu.Unlock()
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

// ProcessedKeys returns the number of distinct (recipient, key) processed.
func (r *Recorder) ProcessedKeys() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := make(map[[2]string]bool)
	for _, p := range r.processed {
		seen[[2]string{p.Recipient, p.Key}] = true
	}
	return len(seen)
}

// Report is the checker's verdict.
type Report struct {
	Seed                    int64
	Sent, Delivered, Queued int // logical messages and their outcomes
	Failed                  int
	Processed               int // handler runs
	DeadLettered            int // acknowledged messages found in a DLQ with a reason
	Lost                    []string
	Duplicates              []string
	CrashWindowDuplicates   []string // allowed: first run on an incarnation that was killed
	OrderViolations         []string
	DeadWithoutReason       []string
	Unexpected              []string // processed but never sent
}

// OK reports whether every invariant holds.
func (r Report) OK() bool {
	return len(r.Lost) == 0 && len(r.Duplicates) == 0 && len(r.OrderViolations) == 0 &&
		len(r.DeadWithoutReason) == 0 && len(r.Unexpected) == 0
}

// Err returns nil when OK, else an error carrying the summary and the seed.
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
	fmt.Fprintf(w, "seed %d: sent %d (delivered %d, queued %d, failed %d), handler runs %d, dead-lettered %d\n",
		r.Seed, r.Sent, r.Delivered, r.Queued, r.Failed, r.Processed, r.DeadLettered)
	list := func(what string, xs []string) {
		fmt.Fprintf(w, "  %-28s %d\n", what, len(xs))
		for i, x := range xs {
			if i == 5 {
				fmt.Fprintf(w, "    ... %d more\n", len(xs)-5)
				break
			}
			fmt.Fprintf(w, "    %s\n", x)
		}
	}
	list("acknowledged lost:", r.Lost)
	list("duplicates (keyed):", r.Duplicates)
	list("order violations:", r.OrderViolations)
	list("dead letters w/o reason:", r.DeadWithoutReason)
	list("processed, never sent:", r.Unexpected)
	list("crash-window re-runs (ok):", r.CrashWindowDuplicates)
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
	type rk struct{ recipient, key string }
	runs := make(map[rk][]Processed)
	for _, p := range processed {
		k := rk{p.Recipient, p.Key}
		runs[k] = append(runs[k], p)
	}
	deadBy := make(map[rk]Dead)
	for _, d := range dead {
		deadBy[rk{d.Recipient, d.Key}] = d
	}
	sentBy := make(map[rk]Sent, len(sent))
	for _, s := range sent {
		sentBy[rk{s.Recipient, s.Key}] = s
		switch s.Outcome {
		case Delivered:
			rep.Delivered++
		case Queued:
			rep.Queued++
		default:
			rep.Failed++
			continue
		}
		k := rk{s.Recipient, s.Key}
		if len(runs[k]) > 0 {
			continue
		}
		d, ok := deadBy[k]
		switch {
		case !ok:
			rep.Lost = append(rep.Lost, fmt.Sprintf("%s -> %s key %q seq %d (%s)", s.Sender, s.Recipient, s.Key, s.Seq, s.Outcome))
		case d.Reason == "":
			rep.DeadWithoutReason = append(rep.DeadWithoutReason, fmt.Sprintf("%s key %q", d.Recipient, d.Key))
		default:
			rep.DeadLettered++
		}
	}
	for k, rs := range runs {
		if _, ok := sentBy[k]; !ok {
			rep.Unexpected = append(rep.Unexpected, fmt.Sprintf("%s key %q", k.recipient, k.key))
		}
		for i := 1; i < len(rs); i++ {
			msg := fmt.Sprintf("%s key %q run %d of %d", k.recipient, k.key, i+1, len(rs))
			if crashed[rs[i-1].Boot] && rs[i-1].Boot != rs[i].Boot {
				rep.CrashWindowDuplicates = append(rep.CrashWindowDuplicates, msg)
			} else {
				rep.Duplicates = append(rep.Duplicates, msg)
			}
		}
	}
	// Order: the first run of each message, per (sender, recipient), must
	// come in increasing sequence. Re-runs are duplicates, not reorders.
	type pair struct{ sender, recipient string }
	last := make(map[pair]uint64)
	first := make(map[rk]bool)
	for _, p := range processed {
		k := rk{p.Recipient, p.Key}
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
	slices.Sort(rep.Duplicates)
	slices.Sort(rep.CrashWindowDuplicates)
	slices.Sort(rep.Unexpected)
	return rep
}

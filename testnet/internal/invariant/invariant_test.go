package invariant

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// script sends n keyed messages a -> w@b and lets mutate decide what the
// receiver processed and what is dead-lettered.
func script(n int, outcome func(i int) Outcome, process func(rec *Recorder, ps []Processed)) (*Recorder, []Processed) {
	rec := NewRecorder(42)
	var ps []Processed
	for i := range n {
		seq := rec.Next("a", "w@b")
		key := fmt.Sprintf("k%d", seq)
		rec.Sent(Sent{Sender: "a", Recipient: "w@b", Key: key, Seq: seq, Outcome: outcome(i)})
		ps = append(ps, Processed{Sender: "a", Recipient: "w@b", Key: key, Seq: seq, Boot: "boot1"})
	}
	process(rec, ps)
	return rec, ps
}

func all(rec *Recorder, ps []Processed) {
	for _, p := range ps {
		rec.Processed(p)
	}
}

func TestCheck(t *testing.T) {
	queued := func(int) Outcome { return Queued }
	tests := []struct {
		name    string
		outcome func(int) Outcome
		process func(*Recorder, []Processed)
		dead    []Dead
		check   func(Report) error
	}{
		{"clean", queued, all, nil, func(r Report) error {
			if !r.OK() || r.Queued != 10 || r.Processed != 10 {
				return fmt.Errorf("want OK with 10 queued and processed: %s", r)
			}
			return nil
		}},
		{"every 10th lost", queued, func(rec *Recorder, ps []Processed) {
			for i, p := range ps {
				if i%10 != 9 {
					rec.Processed(p)
				}
			}
		}, nil, func(r Report) error {
			if len(r.Lost) != 1 || r.OK() {
				return fmt.Errorf("want 1 lost: %s", r)
			}
			return nil
		}},
		{"lost but dead-lettered", queued, func(rec *Recorder, ps []Processed) { all(rec, ps[:9]) },
			[]Dead{{Sender: "a", Recipient: "w@b", Seq: 10, Reason: "expired: older than the retention limit"}}, func(r Report) error {
				if !r.OK() || r.InDLQ != 1 {
					return fmt.Errorf("want OK with 1 in a DLQ: %s", r)
				}
				return nil
			}},
		{"ran, yet dead-lettered as never run", queued, all,
			[]Dead{{Sender: "a", Recipient: "w@b", Seq: 10, Reason: "expired: older than the retention limit"}}, func(r Report) error {
				if len(r.RanYetDeadLettered) != 1 || r.OK() {
					return fmt.Errorf("want 1 run whose dead letter says it never ran: %s", r)
				}
				return nil
			}},
		{"ran, dead letter says outcome unknown", queued, all,
			[]Dead{{Sender: "a", Recipient: "w@b", Seq: 10, Reason: "expired: older than the retention limit (outcome unknown: it may have been sent, and no receipt came back)"}}, func(r Report) error {
				if !r.OK() || len(r.RanYetDeadLettered) != 0 || r.RanOutcomeUnknown != 1 {
					return fmt.Errorf("want OK (the dead letter says it may have run): %s", r)
				}
				return nil
			}},
		{"ran on a killed incarnation only, yet dead-lettered as never run", queued, func(rec *Recorder, ps []Processed) {
			all(rec, ps)
			rec.Crashed("boot1")
		}, []Dead{{Sender: "a", Recipient: "w@b", Seq: 10, Reason: "expired: older than the retention limit"}}, func(r Report) error {
			if !r.OK() || len(r.CrashWindowRanYetDeadLettered) != 1 {
				return fmt.Errorf("want OK with 1 crash-window run dead-lettered: %s", r)
			}
			return nil
		}},
		{"dead letter without reason", queued, func(rec *Recorder, ps []Processed) { all(rec, ps[:9]) },
			[]Dead{{Sender: "a", Recipient: "w@b", Seq: 10}}, func(r Report) error {
				if len(r.DeadWithoutReason) != 1 {
					return fmt.Errorf("want 1 dead letter without reason: %s", r)
				}
				return nil
			}},
		{"healthy message dead-lettered", queued, func(rec *Recorder, ps []Processed) { all(rec, ps[:9]) },
			[]Dead{{Sender: "a", Recipient: "w@b", Seq: 10, Reason: "max attempts: lost"}}, func(r Report) error {
				if len(r.HealthyDeadLettered) != 1 || r.OK() {
					return fmt.Errorf("want 1 healthy dead letter: %s", r)
				}
				return nil
			}},
		{"expired without a TTL", queued, func(rec *Recorder, ps []Processed) { all(rec, ps[:9]) },
			[]Dead{{Sender: "a", Recipient: "w@b", Seq: 10, Reason: "expired"}}, func(r Report) error {
				if len(r.HealthyDeadLettered) != 1 {
					return fmt.Errorf("want 1 healthy dead letter (no TTL was given): %s", r)
				}
				return nil
			}},
		{"dead letter of another sender is not this one", queued, func(rec *Recorder, ps []Processed) { all(rec, ps[:9]) },
			[]Dead{{Sender: "other", Recipient: "w@b", Seq: 10, Reason: "expired: older than the retention limit"}}, func(r Report) error {
				if len(r.Lost) != 1 {
					return fmt.Errorf("want 1 lost: %s", r)
				}
				return nil
			}},
		{"failed sends may vanish", func(i int) Outcome {
			if i == 3 {
				return Failed
			}
			return Delivered
		}, func(rec *Recorder, ps []Processed) {
			for i, p := range ps {
				if i != 3 {
					rec.Processed(p)
				}
			}
		}, nil, func(r Report) error {
			if !r.OK() || r.Failed != 1 {
				return fmt.Errorf("want OK with 1 failed: %s", r)
			}
			return nil
		}},
		{"duplicate", queued, func(rec *Recorder, ps []Processed) { all(rec, ps); rec.Processed(ps[4]) }, nil, func(r Report) error {
			if len(r.Duplicates) != 1 {
				return fmt.Errorf("want 1 duplicate: %s", r)
			}
			return nil
		}},
		{"crash-window rerun", queued, func(rec *Recorder, ps []Processed) {
			all(rec, ps)
			rec.Crashed("boot1")
			p := ps[9]
			p.Boot = "boot2"
			rec.Processed(p)
		}, nil, func(r Report) error {
			if !r.OK() || len(r.CrashWindowDuplicates) != 1 {
				return fmt.Errorf("want OK with 1 crash-window rerun: %s", r)
			}
			return nil
		}},
		{"reorder", queued, func(rec *Recorder, ps []Processed) {
			ps[2], ps[3] = ps[3], ps[2]
			all(rec, ps)
		}, nil, func(r Report) error {
			if len(r.OrderViolations) != 1 {
				return fmt.Errorf("want 1 order violation: %s", r)
			}
			return nil
		}},
		{"rerun of older is not a reorder", queued, func(rec *Recorder, ps []Processed) {
			all(rec, ps)
			rec.Crashed("boot1")
			p := ps[0]
			p.Boot = "boot2"
			rec.Processed(p)
		}, nil, func(r Report) error {
			if !r.OK() {
				return fmt.Errorf("want OK: %s", r)
			}
			return nil
		}},
		{"processed, never sent", queued, func(rec *Recorder, ps []Processed) {
			all(rec, ps)
			rec.Processed(Processed{Sender: "a", Recipient: "w@b", Seq: 99})
		}, nil, func(r Report) error {
			if len(r.Unexpected) != 1 {
				return fmt.Errorf("want 1 unexpected: %s", r)
			}
			return nil
		}},
	}
	tests = append(tests, []struct {
		name    string
		outcome func(int) Outcome
		process func(*Recorder, []Processed)
		dead    []Dead
		check   func(Report) error
	}{
		{"same seq from two senders are two messages", queued, func(rec *Recorder, ps []Processed) {
			all(rec, ps)
			p := ps[0]
			p.Sender = "z"
			rec.Processed(p)
		}, nil, func(r Report) error {
			if len(r.Unexpected) != 1 || len(r.Duplicates) != 0 {
				return fmt.Errorf("want 1 unexpected, no duplicate: %s", r)
			}
			return nil
		}},
	}...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec, _ := script(10, tc.outcome, tc.process)
			rep := rec.Check(tc.dead)
			if err := tc.check(rep); err != nil {
				t.Fatal(err)
			}
			if rep.OK() != (rep.Err() == nil) {
				t.Fatalf("OK() = %v but Err() = %v", rep.OK(), rep.Err())
			}
			if !strings.Contains(rep.String(), "seed 42") {
				t.Fatalf("report does not print the seed:\n%s", rep)
			}
		})
	}
}

func TestErrPrintsSeed(t *testing.T) {
	rec := NewRecorder(7)
	rec.Sent(Sent{Sender: "a", Recipient: "w@b", Key: "k", Seq: rec.Next("a", "w@b"), Outcome: Delivered})
	err := rec.Check(nil).Err()
	if err == nil || !strings.Contains(err.Error(), "seed 7") {
		t.Fatalf("Err() = %v, want a violation naming seed 7", err)
	}
	if errors.Unwrap(err) != nil {
		t.Fatalf("unexpected wrapped error %v", errors.Unwrap(err))
	}
}

func BenchmarkCheck(b *testing.B) {
	rec := NewRecorder(1)
	for i := range 100000 {
		to := fmt.Sprintf("w%d@n", i%100)
		seq := rec.Next("a", to)
		key := fmt.Sprint(i)
		rec.Sent(Sent{Sender: "a", Recipient: to, Key: key, Seq: seq, Outcome: Queued})
		rec.Processed(Processed{Sender: "a", Recipient: to, Key: key, Seq: seq})
	}
	b.ReportAllocs()
	for b.Loop() {
		if !rec.Check(nil).OK() {
			b.Fatal("not OK")
		}
	}
	b.ReportMetric(100000*float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// Poison and TTL messages may end in a DLQ for their reason, and poison
// must never run.
func TestDeservedDeadLetters(t *testing.T) {
	rec := NewRecorder(3)
	rec.Sent(Sent{Sender: "a", Recipient: "w@b", Seq: rec.Next("a", "w@b"), Poison: true, Outcome: DeadLettered})
	rec.Sent(Sent{Sender: "a", Recipient: "w@b", Seq: rec.Next("a", "w@b"), TTL: true, Outcome: Queued})
	rec.Sent(Sent{Sender: "a", Recipient: "w@b", Seq: rec.Next("a", "w@b"), Poison: true, Outcome: Queued})
	rec.Processed(Processed{Sender: "a", Recipient: "w@b", Seq: 3})
	rep := rec.Check([]Dead{
		{Sender: "a", Recipient: "w@b", Seq: 1, Reason: "rejected: cannot parse"},
		{Sender: "a", Recipient: "w@b", Seq: 2, Reason: "expired"},
	})
	if rep.InDLQ != 2 || len(rep.HealthyDeadLettered) != 0 || len(rep.Unexpected) != 1 || rep.OK() {
		t.Fatalf("want 2 deserved dead letters and poison #3 reported as run: %s", rep)
	}
}

package outbox_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

type mitem struct {
	typ     string
	seq     uint64
	expires int64 // unix ms, 0 = never
	tries   int
}

// TestPropertyModel drives the store with random enqueue / ack / fail /
// expire / overwrite / reopen sequences and checks it against a model:
// per-recipient order holds and nothing is lost (every message is queued,
// delivered, superseded or dead-lettered).
func TestPropertyModel(t *testing.T) {
	recipients := []string{"a@n1", "b@n1", "c@n2"}
	keys := []string{"k1", "k2"}
	dir := t.TempDir()
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		path := filepath.Join(dir, fmt.Sprintf("p%d.db", run))
		clk := newClock()
		mut := func(c *outbox.Config) { c.Now = clk.Now; c.MaxAttempts = 3 }
		s := openRapid(rt, path, mut)
		defer func() { _ = s.Close() }()
		ctx := context.Background()
		model := map[string][]mitem{}
		newest := map[string]uint64{} // recipient\x00key -> newest sequence seen
		dead, delivered, next := 0, 0, 0
		steps := rapid.IntRange(1, 25).Draw(rt, "steps")
		for range steps {
			r := rapid.SampledFrom(recipients).Draw(rt, "recipient")
			switch rapid.IntRange(0, 6).Draw(rt, "action") {
			case 0, 1: // plain enqueue, sometimes with a short TTL
				next++
				e := &pb.Envelope{Recipient: r, Type: fmt.Sprint("m", next)}
				if rapid.Bool().Draw(rt, "ttl") {
					e.ExpiresAtUnixMs = clk.Now().Add(time.Second).UnixMilli()
				}
				if err := s.Enqueue(ctx, e); err != nil {
					rt.Fatal(err)
				}
				model[r] = append(model[r], mitem{typ: e.Type, seq: e.Sequence, expires: e.ExpiresAtUnixMs})
			case 2: // overwrite, newer or older
				next++
				k := rapid.SampledFrom(keys).Draw(rt, "key")
				e := &pb.Envelope{Recipient: r, Type: fmt.Sprint("o", next), IdempotencyKey: k, Conflict: pb.Envelope_OVERWRITE}
				nk := r + "\x00" + k
				older := newest[nk] > 1 && rapid.Bool().Draw(rt, "older")
				if older {
					e.Sequence = newest[nk] - 1
				}
				res, err := s.EnqueueResult(ctx, e)
				if err != nil {
					rt.Fatal(err)
				}
				if older {
					if res != outbox.Superseded {
						rt.Fatalf("older overwrite result %v", res)
					}
					continue
				}
				if old := newest[nk]; old != 0 {
					model[r] = slices.DeleteFunc(model[r], func(m mitem) bool { return m.seq == old })
				}
				newest[nk] = e.Sequence
				model[r] = append(model[r], mitem{typ: e.Type, seq: e.Sequence})
			case 3: // ack some of the head
				n := rapid.IntRange(1, 3).Draw(rt, "n")
				msgs, err := s.Head(r, n)
				if err != nil {
					rt.Fatal(err)
				}
				dead += expireModel(model, r, clk.Now().UnixMilli())
				var sq []uint64
				for _, m := range msgs {
					sq = append(sq, m.GetEnvelope().GetSequence())
				}
				if err := s.Ack(r, sq); err != nil {
					rt.Fatal(err)
				}
				model[r] = model[r][len(sq):]
				delivered += len(sq)
			case 4: // counted or permanent failure of the head
				msgs, err := s.Head(r, 1)
				if err != nil {
					rt.Fatal(err)
				}
				dead += expireModel(model, r, clk.Now().UnixMilli())
				if len(msgs) == 0 {
					continue
				}
				perm := rapid.Bool().Draw(rt, "permanent")
				gone, err := s.Fail(r, msgs[0].GetEnvelope().GetSequence(), outbox.Failure{Reason: "x", Counts: true, Permanent: perm})
				if err != nil {
					rt.Fatal(err)
				}
				model[r][0].tries++
				wantGone := perm || model[r][0].tries >= 3
				if gone != wantGone {
					rt.Fatalf("dead-lettered %v, want %v", gone, wantGone)
				}
				if gone {
					model[r] = model[r][1:]
					dead++
				}
			case 5: // time passes: TTLs expire
				clk.Advance(2 * time.Second)
			case 6: // restart
				if err := s.Close(); err != nil {
					rt.Fatal(err)
				}
				s = openRapid(rt, path, mut)
			}
			// Check every queue against the model.
			for _, rc := range recipients {
				msgs, err := s.Head(rc, 1000)
				if err != nil {
					rt.Fatal(err)
				}
				dead += expireModel(model, rc, clk.Now().UnixMilli())
				var got, want []string
				for _, m := range msgs {
					got = append(got, m.GetEnvelope().GetType())
				}
				for _, m := range model[rc] {
					want = append(want, m.typ)
				}
				if !slices.Equal(got, want) {
					rt.Fatalf("%s: store %v, model %v", rc, got, want)
				}
				if s.Pending(rc) != len(want) {
					rt.Fatalf("%s: pending %d, model %d", rc, s.Pending(rc), len(want))
				}
			}
			st := s.Stats()
			if st.DLQDepth != dead {
				rt.Fatalf("dlq %d, model %d", st.DLQDepth, dead)
			}
		}
	})
}

// expireModel drops expired items of r from the model (Head dead-letters
// them) and returns how many.
func expireModel(model map[string][]mitem, r string, nowMs int64) int {
	before := len(model[r])
	model[r] = slices.DeleteFunc(model[r], func(m mitem) bool { return m.expires != 0 && m.expires <= nowMs })
	return before - len(model[r])
}

// openRapid is openAt for *rapid.T, which is not a testing.TB.
func openRapid(rt *rapid.T, path string, mut func(*outbox.Config)) *outbox.Store {
	cfg := outbox.DefaultConfig(path)
	cfg.LockTimeout = 200 * time.Millisecond
	mut(&cfg)
	s, err := outbox.Open(cfg)
	if err != nil {
		rt.Fatalf("open %s: %v", path, err)
	}
	return s
}

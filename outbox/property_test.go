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

// mitem is the model of one message.
type mitem struct {
	typ       string
	recipient string
	seq       uint64
	key       string // OVERWRITE coalesce key ("" = APPEND)
	created   int64  // elapsed ms
	ttl       int64  // ms, 0 = none
	tries     int
}

// model is what the store should hold.
type model struct {
	queues map[string][]mitem // by recipient, in sequence order
	dlq    []mitem
	newest map[string]uint64 // recipient NUL key -> newest version's sequence
}

func (m *model) insert(it mitem) {
	q := append(m.queues[it.recipient], it)
	slices.SortFunc(q, func(a, b mitem) int { return cmpU64(a.seq, b.seq) })
	m.queues[it.recipient] = q
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// expire moves every message whose TTL ran out at now to the DLQ, as Head
// does for messages never sent.
func (m *model) expire(r string, now int64) {
	m.queues[r] = slices.DeleteFunc(m.queues[r], func(it mitem) bool {
		if it.ttl > 0 && it.created+it.ttl <= now {
			m.dlq = append(m.dlq, it)
			return true
		}
		return false
	})
}

// TestPropertyModel drives the store with random sequences of enqueues
// (sequences reserved and used out of order), overwrites (newer and
// older), acks, counted, uncounted and permanent failures, time passing
// (TTLs), drops, replays and restarts, and checks it against a model:
// every queue in sequence order, nothing lost, nothing duplicated, every
// message queued, delivered, superseded or dead-lettered.
func TestPropertyModel(t *testing.T) {
	recipients := []string{"a@n1", "b@n1", "c@n2"}
	keys := []string{"k1", "k2"}
	dir := t.TempDir()
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		path := filepath.Join(dir, fmt.Sprintf("p%d.db", run))
		clk := outbox.NewManualClock(epoch0)
		mut := func(c *outbox.Config) { c.MaxAttempts = 3; c.SequenceBlock = 8 }
		s, err := outbox.Open(config(path, clk, mut))
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { _ = s.Close() }()
		ctx := context.Background()
		m := &model{queues: map[string][]mitem{}, newest: map[string]uint64{}}
		var held []uint64 // reserved, not yet used: stored later, below higher ones
		next := 0
		reserve := func() uint64 {
			seq, err := s.ReserveSequence()
			if err != nil {
				rt.Fatal(err)
			}
			return seq
		}
		steps := rapid.IntRange(1, 30).Draw(rt, "steps")
		for range steps {
			r := rapid.SampledFrom(recipients).Draw(rt, "recipient")
			now := s.ElapsedMs()
			switch action := rapid.IntRange(0, 9).Draw(rt, "action"); action {
			case 0, 1, 2: // enqueue, sometimes at a held (lower) sequence, sometimes an OVERWRITE
				next++
				it := mitem{typ: fmt.Sprint("m", next), recipient: r, created: now}
				if len(held) > 0 && rapid.Bool().Draw(rt, "use held") {
					it.seq, held = held[0], held[1:]
				} else {
					it.seq = reserve()
				}
				if rapid.Bool().Draw(rt, "ttl") {
					it.ttl = rapid.Int64Range(1000, 4000).Draw(rt, "ttl ms")
				}
				if action == 2 {
					it.key = rapid.SampledFrom(keys).Draw(rt, "key")
				}
				sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: r, Type: it.typ, Sequence: it.seq, TtlMs: it.ttl}}
				if it.key != "" {
					sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, it.key
				}
				res, err := s.Enqueue(ctx, sm)
				if err != nil {
					rt.Fatal(err)
				}
				want := outbox.Queued
				if it.key != "" {
					nk := r + "\x00" + it.key
					old := m.newest[nk]
					switch {
					case old >= it.seq:
						want = outbox.Superseded
					case slices.ContainsFunc(m.queues[r], func(x mitem) bool { return x.seq == old }):
						want = outbox.Replaced
						m.queues[r] = slices.DeleteFunc(m.queues[r], func(x mitem) bool { return x.seq == old })
					}
					if want != outbox.Superseded {
						m.newest[nk] = it.seq
					}
				}
				if res != want {
					rt.Fatalf("enqueue %s seq %d: %v, want %v", it.typ, it.seq, res, want)
				}
				if want != outbox.Superseded {
					m.insert(it)
				}
			case 3: // hold a sequence for later
				held = append(held, reserve())
			case 4: // ack some of the head
				m.expire(r, now)
				msgs, _, err := s.Head(outbox.HeadRequest{Recipient: r, Max: rapid.IntRange(1, 3).Draw(rt, "n")})
				if err != nil {
					rt.Fatal(err)
				}
				var sq []uint64
				for _, x := range msgs {
					sq = append(sq, x.GetEnvelope().GetSequence())
				}
				if err := s.Ack(r, sq); err != nil {
					rt.Fatal(err)
				}
				m.queues[r] = m.queues[r][len(sq):]
			case 5: // a verdict on the head
				m.expire(r, now)
				msgs, _, err := s.Head(outbox.HeadRequest{Recipient: r, Max: 1})
				if err != nil {
					rt.Fatal(err)
				}
				if len(msgs) == 0 {
					continue
				}
				f := outbox.Failure{Reason: "x"}
				switch rapid.IntRange(0, 2).Draw(rt, "verdict") {
				case 0:
					f.Counts = true
				case 1:
					f.Permanent = true
				}
				_, dead, err := s.Fail(r, msgs[0].GetEnvelope().GetSequence(), f)
				if err != nil {
					rt.Fatal(err)
				}
				if f.Counts {
					m.queues[r][0].tries++
				}
				if wantDead := f.Permanent || m.queues[r][0].tries >= 3; dead != wantDead {
					rt.Fatalf("dead-lettered %v, want %v", dead, wantDead)
				}
				if dead {
					m.dlq = append(m.dlq, m.queues[r][0])
					m.queues[r] = m.queues[r][1:]
				}
			case 6: // time passes
				clk.Advance(time.Duration(rapid.IntRange(0, 3000).Draw(rt, "advance ms")) * time.Millisecond)
			case 7: // restart, some time passing while closed
				if err := s.Close(); err != nil {
					rt.Fatal(err)
				}
				clk.Advance(time.Duration(rapid.IntRange(0, 3000).Draw(rt, "down ms")) * time.Millisecond)
				if s, err = outbox.Open(config(path, clk, mut)); err != nil {
					rt.Fatal(err)
				}
			case 8: // drop a queue
				m.expire(r, now)
				if _, err := s.DropQueue(r, "x"); err != nil {
					rt.Fatal(err)
				}
				m.dlq = append(m.dlq, m.queues[r]...)
				m.queues[r] = nil
			case 9: // replay every dead letter, in the store's DLQ order
				dl, err := s.DeadLetters(outbox.DLQFilter{Limit: 10000})
				if err != nil {
					rt.Fatal(err)
				}
				n, err := s.Replay(outbox.DLQFilter{All: true})
				if err != nil && n > 0 {
					rt.Fatal(err)
				}
				replayed, _ := s.DeadLetters(outbox.DLQFilter{Limit: 10000})
				left := map[string]bool{}
				for _, d := range replayed {
					left[d.Message.GetEnvelope().GetType()] = true
				}
				// The new sequences: read back from the queues.
				seqOf := map[string]uint64{}
				for _, rc := range recipients {
					msgs, _, err := s.Head(outbox.HeadRequest{Recipient: rc, Max: 1000})
					if err != nil {
						rt.Fatal(err)
					}
					for _, x := range msgs {
						seqOf[x.GetEnvelope().GetType()] = x.GetEnvelope().GetSequence()
					}
				}
				for _, d := range dl {
					typ := d.Message.GetEnvelope().GetType()
					i := slices.IndexFunc(m.dlq, func(x mitem) bool { return x.typ == typ })
					if i < 0 {
						rt.Fatalf("dead letter %s not in the model", typ)
					}
					it := m.dlq[i]
					nk := it.recipient + "\x00" + it.key
					superseded := it.key != "" && m.newest[nk] > it.seq
					if superseded != left[typ] {
						rt.Fatalf("dead letter %s: left in the DLQ %v, want %v", typ, left[typ], superseded)
					}
					if superseded {
						continue
					}
					m.dlq = slices.Delete(m.dlq, i, i+1)
					if seqOf[typ] <= it.seq {
						rt.Fatalf("replayed %s at sequence %d, not above its old %d", typ, seqOf[typ], it.seq)
					}
					it.seq, it.tries, it.created = seqOf[typ], 0, now
					if it.key != "" {
						m.newest[nk] = it.seq
					}
					m.insert(it)
				}
			}
			check(rt, s, m, recipients)
		}
	})
}

func check(rt *rapid.T, s *outbox.Store, m *model, recipients []string) {
	now := s.ElapsedMs()
	depth := 0
	for _, r := range recipients {
		m.expire(r, now)
		msgs, _, err := s.Head(outbox.HeadRequest{Recipient: r, Max: 1000})
		if err != nil {
			rt.Fatal(err)
		}
		var got, want []string
		for _, x := range msgs {
			got = append(got, fmt.Sprintf("%s/%d/%d", x.GetEnvelope().GetType(), x.GetEnvelope().GetSequence(), x.GetAttempts()))
		}
		for _, it := range m.queues[r] {
			want = append(want, fmt.Sprintf("%s/%d/%d", it.typ, it.seq, it.tries))
		}
		if !slices.Equal(got, want) {
			rt.Fatalf("%s: store %v, model %v", r, got, want)
		}
		if s.Pending(r) != len(want) {
			rt.Fatalf("%s: pending %d, model %d", r, s.Pending(r), len(want))
		}
		depth += len(want)
	}
	dl, err := s.DeadLetters(outbox.DLQFilter{Limit: 10000})
	if err != nil {
		rt.Fatal(err)
	}
	var got, want []string
	for _, d := range dl {
		got = append(got, d.Message.GetEnvelope().GetType())
	}
	for _, it := range m.dlq {
		want = append(want, it.typ)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		rt.Fatalf("dlq: store %v, model %v", got, want)
	}
	if st := s.Stats(); st.Depth != depth || st.DLQDepth != len(want) {
		rt.Fatalf("stats depth %d dlq %d, model %d %d", st.Depth, st.DLQDepth, depth, len(want))
	}
}

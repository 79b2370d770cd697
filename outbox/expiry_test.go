package outbox_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// withTTL enqueues a message with a TTL and returns its sequence.
func (e *env) withTTL(tb testing.TB, recipient, typ string, ttl time.Duration) uint64 {
	tb.Helper()
	sm := e.msg(tb, recipient, typ)
	sm.Envelope.TtlMs = ttl.Milliseconds()
	e.put(tb, sm)
	return sm.GetEnvelope().GetSequence()
}

func (e *env) deadReasons(tb testing.TB) map[string]string {
	tb.Helper()
	dl, err := e.DeadLetters(outbox.DLQFilter{Limit: 1000})
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range dl {
		out[d.Message.GetEnvelope().GetType()] = d.Reason
	}
	return out
}

// A message whose TTL ran out and that was never on the wire (sequence
// above EmittedHW) is given up at once; the ones behind it flow.
func TestExpiredNeverSentGivenUpAtOnce(t *testing.T) {
	e := open(t, nil)
	e.withTTL(t, "a@n1", "short", 10*time.Second)
	e.withTTL(t, "a@n1", "long", time.Hour)
	e.send(t, "a@n1", "none")
	e.clk.Advance(10 * time.Second) // exactly the TTL: expired
	msgs, wait, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 10})
	if err != nil || wait != 0 {
		t.Fatalf("head: %v wait %d", err, wait)
	}
	if got := typesOf(msgs); !slices.Equal(got, []string{"long", "none"}) {
		t.Fatalf("head %v", got)
	}
	if r := e.deadReasons(t); r["short"] != outbox.ReasonExpired {
		t.Fatalf("dead letters %v", r)
	}
	if st := e.Stats(); st.Expired != 1 || st.Depth != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// A message that was on the wire may still run at the receiver until its
// TTL has passed there too: it is given up only after TTL + MaxClockSkew,
// and Head stops before it meanwhile (returning when to look again), so
// nothing behind it overtakes it.
func TestExpiredAfterSendWaitsForSkew(t *testing.T) {
	e := open(t, func(c *outbox.Config) { c.MaxClockSkew = time.Minute })
	created := e.ElapsedMs()
	first := e.send(t, "a@n1", "before")
	seq := e.withTTL(t, "a@n1", "sent", 10*time.Second)
	e.send(t, "a@n1", "after")
	e.clk.Advance(30 * time.Second)
	req := outbox.HeadRequest{Recipient: "a@n1", Max: 10, EmittedHW: seq}
	msgs, wait, err := e.Head(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := typesOf(msgs); !slices.Equal(got, []string{"before"}) {
		t.Fatalf("head %v, want only the message before the expired one", got)
	}
	if want := created + (10 * time.Second).Milliseconds() + time.Minute.Milliseconds(); wait != want {
		t.Fatalf("waitUntil %d, want TTL + skew = %d", wait, want)
	}
	req.Skip = first // the one before is being acked: the head is the expired one
	if msgs, wait2, _ := e.Head(req); len(msgs) != 0 || wait2 != wait {
		t.Fatalf("head %v wait %d, want nothing until %d", typesOf(msgs), wait2, wait)
	}
	e.clk.Advance(time.Duration(wait-e.ElapsedMs()) * time.Millisecond)
	msgs, wait, err = e.Head(req)
	if err != nil || wait != 0 {
		t.Fatalf("head: %v wait %d", err, wait)
	}
	if got := typesOf(msgs); !slices.Equal(got, []string{"after"}) {
		t.Fatalf("head %v after TTL + skew", got)
	}
	if r := e.deadReasons(t); r["sent"] != outbox.ReasonExpiredUnknown {
		t.Fatalf("dead letters %v", r)
	}
}

// A message is given up once it is older than MaxAge (StreamRetention -
// RetentionMargin), TTL or not, sent or not. One that was sent (at or below
// the stream's emitted high-water) may have run, and its reason says so.
func TestTooOldGivenUp(t *testing.T) {
	e := open(t, func(c *outbox.Config) {
		c.StreamRetention = 10 * time.Hour
		c.RetentionMargin = 2 * time.Hour
	})
	s := e.send(t, "a@n1", "old and sent")
	e.send(t, "a@n1", "old")
	e.clk.Advance(time.Hour)
	e.send(t, "a@n1", "young")
	e.clk.Advance(7 * time.Hour) // the old ones are 8 h old: MaxAge
	msgs, _, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 10, EmittedHW: s[0]})
	if err != nil {
		t.Fatal(err)
	}
	if got := typesOf(msgs); !slices.Equal(got, []string{"young"}) {
		t.Fatalf("head %v", got)
	}
	if r := e.deadReasons(t); r["old and sent"] != outbox.ReasonTooOldUnknown || r["old"] != outbox.ReasonTooOld {
		t.Fatalf("dead letters %v; want the one sent %q, the other %q", r, outbox.ReasonTooOldUnknown, outbox.ReasonTooOld)
	}
}

// ExpiryCandidates lists what the sweeper should look at while nobody
// reads the queue: messages past their TTL deadline (the relay, which
// knows what was sent, adds the skew for those) and queue heads past
// MaxAge, with the time of the next one.
func TestExpiryCandidates(t *testing.T) {
	e := open(t, func(c *outbox.Config) {
		c.MaxClockSkew = time.Minute
		c.StreamRetention = 10 * time.Hour
		c.RetentionMargin = 2 * time.Hour
	})
	t0 := e.ElapsedMs()
	a := e.withTTL(t, "a@n1", "a-10s", 10*time.Second)
	b := e.withTTL(t, "b@n2", "b-20s", 20*time.Second)
	e.send(t, "c@n3", "c-none")
	now := e.ElapsedMs()
	if c, next, err := e.ExpiryCandidates(now, 10); err != nil || len(c) != 0 || next != t0+10_000 {
		t.Fatalf("before: %v next %d (%v), want none and next %d", c, next, err, t0+10_000)
	}
	e.clk.Advance(15 * time.Second)
	c, next, err := e.ExpiryCandidates(e.ElapsedMs(), 10)
	if err != nil || len(c) != 1 || c[0] != (outbox.Expiring{Recipient: "a@n1", Seq: a, DeadlineMs: t0 + 10_000}) || next != t0+20_000 {
		t.Fatalf("after 15s: %+v next %d (%v)", c, next, err)
	}
	e.clk.Advance(8 * time.Hour)
	c, _, err = e.ExpiryCandidates(e.ElapsedMs(), 10)
	if err != nil {
		t.Fatal(err)
	}
	var ttl, old int
	for _, x := range c {
		if x.DeadlineMs != 0 {
			ttl++
		} else {
			old++
		}
	}
	if ttl != 2 || old != 3 {
		t.Fatalf("after 8h: %+v, want 2 TTL candidates and 3 too-old heads", c)
	}
	// The limit bounds the answer and says more are due now.
	c, next, _ = e.ExpiryCandidates(e.ElapsedMs(), 1)
	if len(c) != 1 || next != e.ElapsedMs() {
		t.Fatalf("limit 1: %+v next %d, want one and next = now", c, next)
	}
	if n, err := e.Expire("b@n2", []uint64{b, b + 1000}, outbox.ReasonExpiredUnknown); n != 1 || err != nil {
		t.Fatalf("expire: %d %v", n, err)
	}
	c, _, _ = e.ExpiryCandidates(e.ElapsedMs(), 10)
	for _, x := range c {
		if x.Recipient == "b@n2" {
			t.Fatalf("expired message still a candidate: %+v", c)
		}
	}
}

func typesOf(msgs []*pb.StoredMessage) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.GetEnvelope().GetType())
	}
	return out
}

// ExpiryCandidatesAfter goes on after the last candidate of an earlier
// look: every candidate with a TTL deadline comes once, in deadline
// order, and the queue heads past MaxAge come with the look that reached
// the last of them.
func TestExpiryCandidatesAfterGoesOn(t *testing.T) {
	e := open(t, func(c *outbox.Config) {
		c.StreamRetention = 10 * time.Hour
		c.RetentionMargin = 2 * time.Hour
	})
	var want []uint64
	for i := range 7 {
		want = append(want, e.withTTL(t, "a@n1", fmt.Sprintf("a-%d", i), time.Duration(i+1)*time.Second))
	}
	e.send(t, "c@n3", "c-none")
	e.clk.Advance(9 * time.Hour) // every TTL over; both queues' heads past MaxAge
	var got []uint64
	heads := 0
	after := outbox.Expiring{}
	for look := 0; ; look++ {
		if look == 10 {
			t.Fatalf("no end after 10 looks: %v", got)
		}
		c, next, err := e.ExpiryCandidatesAfter(e.ElapsedMs(), 3, after)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range c {
			if x.DeadlineMs != 0 {
				got = append(got, x.Seq)
			} else {
				heads++
			}
		}
		if len(c) < 3 || c[len(c)-1].DeadlineMs == 0 {
			break // the end of the candidates with a TTL deadline
		}
		if next != e.ElapsedMs() {
			t.Fatalf("a full look says the next is at %d, want now (%d)", next, e.ElapsedMs())
		}
		after = c[len(c)-1]
	}
	if !slices.Equal(got, want) || heads != 2 {
		t.Fatalf("looks of 3 gave TTL candidates %v and %d heads; want %v once each, in order, and 2 heads", got, heads, want)
	}
}

// The candidate a look stopped at is given up (or acked) before the next
// look: the next goes on with the one after it, skipping none.
func TestExpiryCandidatesAfterACandidateGivenUp(t *testing.T) {
	e := open(t, nil)
	var want []uint64
	for i := range 6 {
		want = append(want, e.withTTL(t, "a@n1", fmt.Sprintf("a-%d", i), time.Duration(i+1)*time.Second))
	}
	e.clk.Advance(time.Minute)
	c, _, err := e.ExpiryCandidatesAfter(e.ElapsedMs(), 2, outbox.Expiring{})
	if err != nil || len(c) != 2 {
		t.Fatal(c, err)
	}
	if _, err := e.Expire("a@n1", []uint64{c[1].Seq}, outbox.ReasonExpired); err != nil {
		t.Fatal(err)
	}
	c2, _, err := e.ExpiryCandidatesAfter(e.ElapsedMs(), 10, c[1])
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, x := range c2 {
		got = append(got, x.Seq)
	}
	if !slices.Equal(got, want[2:]) {
		t.Fatalf("got %v want %v", got, want[2:])
	}
}

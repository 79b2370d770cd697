package testnet

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/partition"
)

// fastForward shortens what a partial partition takes to notice (a
// handshake timeout, an idle timeout, two failed emissions) and to heal
// (the probe), so the test runs in seconds. The rule is the shipped one.
func fastForward(off ...int) Option {
	return WithConfig(func(i int, cfg *node.Config) {
		cfg.Transport.HandshakeTimeout = time.Second
		cfg.Transport.KeepAlivePeriod = 250 * time.Millisecond
		cfg.Transport.MaxIdleTimeout = 1500 * time.Millisecond
		cfg.Relay.Backoff = partition.BackoffConfig{Base: 20 * time.Millisecond, Cap: 500 * time.Millisecond}
		cfg.Relay.Forward = partition.ForwardConfig{After: 2, Probe: 500 * time.Millisecond}
		for _, j := range off {
			if i == j {
				cfg.Relay.Forward.After = 0 // takes no part in forwarding
			}
		}
	})
}

// sendN sends n reliable messages from node from to sink@to and fails tb
// on an error.
func sendN(tb testing.TB, c *Cluster, rec *Recorder, from, to, n int) {
	tb.Helper()
	for range n {
		if _, err := SendReliable(context.Background(), rec, c.Node(from), c.Addr("sink", to)); err != nil {
			tb.Fatalf("send: %v", err)
		}
	}
}

func checkReport(tb testing.TB, c *Cluster, rec *Recorder, want int) Report {
	tb.Helper()
	rep, err := c.Check(rec)
	if err != nil {
		tb.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		tb.Fatal(err)
	}
	if rep.Sent != want || rep.Processed != want || rep.InDLQ != 0 {
		tb.Fatalf("want %d sent and run once each, none dead:\n%s", want, rep)
	}
	return rep
}

// A↔C cut, both alive (B keeps C alive in A's membership through
// indirect probes): A's reliable messages to C flow through B, in order,
// exactly once; the heal moves them back to the direct path.
func TestPartialPartitionForwardsThroughAMember(t *testing.T) {
	rec := NewRecorder(16)
	c := New(t, 3, sinks(rec, NoBug), fastForward())
	const a, b, cc = 0, 1, 2

	sendN(t, c, rec, a, cc, 20) // the direct path, healthy
	if err := c.WaitDrained(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	c.Cut(a, cc)
	cutAt := time.Now()
	sent := 20
	testutil.WaitFor(t, 30*time.Second, "A's streams to C go through B", func() bool {
		sendN(t, c, rec, a, cc, 5)
		sent += 5
		return c.Node(a).Routes()[c.Name(cc)].Via == c.Name(b)
	})
	t.Logf("A forwards to C through B %v after the cut", time.Since(cutAt).Round(time.Millisecond))
	if err := c.WaitDrained(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !c.Sees(a, cc) {
		t.Fatal("A lost C from membership: this is not a partial partition")
	}

	// A backlog through the forwarder (its throughput is measured by
	// BenchmarkForwarded in package node).
	const backlog = 150
	carried0 := c.Node(b).Stats().Forward.Carried
	ab0, bc0 := c.Node(a).PeerStats()[c.Name(b)], c.Node(b).PeerStats()[c.Name(cc)]
	cb0, ba0 := c.Node(cc).PeerStats()[c.Name(b)], c.Node(b).PeerStats()[c.Name(a)]
	start := time.Now()
	sendN(t, c, rec, a, cc, backlog)
	sent += backlog
	if err := c.WaitDrained(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	carried := c.Node(b).Stats().Forward.Carried - carried0
	t.Logf("%d messages sent one by one and run at C through B in %v", backlog, time.Since(start).Round(time.Millisecond))
	if carried < backlog {
		t.Fatalf("B carried %d envelopes for a backlog of %d: the backlog did not go through B", carried, backlog)
	}
	// Each forwarded envelope carries its origin; the origin's node,
	// outbox id and certificate (about half a kilobyte) go once per lane
	// stream, so a carried message costs about what a direct one does
	// and its signature.
	ab, bc := c.Node(a).PeerStats()[c.Name(b)], c.Node(b).PeerStats()[c.Name(cc)]
	perAB, perBC := float64(ab.BytesOut-ab0.BytesOut)/float64(carried), float64(bc.BytesOut-bc0.BytesOut)/float64(carried)
	t.Logf("bytes a carried message: %.0f A → B, %.0f B → C", perAB, perBC)
	if perAB > 400 || perBC > 400 {
		t.Fatalf("%.0f bytes a carried message A → B, %.0f B → C: want under 400 (origins named)", perAB, perBC)
	}
	// Its receipt, signed by C, comes back the same way; C's node and
	// certificate go once per control stream.
	cb, ba := c.Node(cc).PeerStats()[c.Name(b)], c.Node(b).PeerStats()[c.Name(a)]
	perCB, perBA := float64(cb.BytesOut-cb0.BytesOut)/float64(carried), float64(ba.BytesOut-ba0.BytesOut)/float64(carried)
	t.Logf("bytes a carried message's receipt: %.0f C → B, %.0f B → A", perCB, perBA)
	if perCB > 300 || perBA > 300 {
		t.Fatalf("%.0f bytes a carried message's receipt C → B, %.0f B → A: want under 300 (signers named)", perCB, perBA)
	}
	sa, sb, sc := c.Node(a).Stats().Forward, c.Node(b).Stats().Forward, c.Node(cc).Stats().Forward
	if sa.Sent == 0 || sb.Carried == 0 || sc.Accepted == 0 || sc.Refused != 0 || sa.BadReceipts != 0 {
		t.Fatalf("forward stats: A %+v, B %+v, C %+v", sa, sb, sc)
	}
	checkReport(t, c, rec, sent)

	// The heal: with traffic, the probe finds the direct path, and what
	// follows goes direct.
	c.Heal()
	healAt := time.Now()
	testutil.WaitFor(t, 30*time.Second, "A's streams to C go direct again", func() bool {
		sendN(t, c, rec, a, cc, 5)
		sent += 5
		return len(c.Node(a).Routes()) == 0
	})
	t.Logf("A sends to C directly again %v after the heal", time.Since(healAt).Round(time.Millisecond))
	if err := c.WaitDrained(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	carried0 = c.Node(b).Stats().Forward.Carried
	sendN(t, c, rec, a, cc, 100)
	sent += 100
	if err := c.WaitDrained(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := c.Node(b).Stats().Forward.Carried; got != carried0 {
		t.Fatalf("B carried %d more envelopes after the heal: want the direct path", got-carried0)
	}
	rep := checkReport(t, c, rec, sent)
	t.Logf("%s", rep)
}

// A↔C cut, both alive, and the only other member takes no part in
// forwarding: the messages wait (not dead-lettered, nothing counted) and
// are delivered after the heal, in order, once.
func TestPartialPartitionWithoutForwarderWaits(t *testing.T) {
	rec := NewRecorder(17)
	c := New(t, 3, sinks(rec, NoBug), fastForward(1))
	const a, cc = 0, 2
	c.Cut(a, cc)
	sent := 0
	testutil.WaitFor(t, 30*time.Second, "A finds C unreachable and nobody to forward", func() bool {
		sendN(t, c, rec, a, cc, 5)
		sent += 5
		r, ok := c.Node(a).Routes()[c.Name(cc)]
		return ok && r.Via == ""
	})
	sendN(t, c, rec, a, cc, 50)
	sent += 50
	stalled := c.Node(a).Routes()[c.Name(cc)].Stalled
	testutil.WaitFor(t, 30*time.Second, "A retries and waits again", func() bool {
		return c.Node(a).Routes()[c.Name(cc)].Stalled >= stalled+3
	})
	if !c.Sees(a, cc) {
		t.Fatal("A lost C from membership: this is not a partial partition")
	}
	if _, processed := rec.Counts(); processed != 0 {
		t.Fatalf("%d messages ran at C across the cut with no forwarder", processed)
	}
	if dead, err := c.DeadLetters(); err != nil || len(dead) != 0 {
		t.Fatalf("dead letters while waiting: %v %v", dead, err)
	}
	c.Heal()
	if err := c.WaitDrained(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	checkReport(t, c, rec, sent)
	if s := c.Node(1).Stats().Forward; s.Carried != 0 {
		t.Fatalf("a node that takes no part in forwarding carried %d", s.Carried)
	}
}

package node_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A sender restored from a backup sends the emission w, x, y under the
// sequences 2, 3, 4 of a stream whose watermark is 3 (c ran there): x, at
// the watermark with other contents, is answered DIVERGED. When the sink
// is there, its owner marks the stream divergent (and commits the mark):
// the old epoch has nothing more to run, y is answered DIVERGED, and so is
// any later copy of the old epoch; the sender sends w, x, y again in a new
// epoch, where they run once each, in order.
//
// When the sink is stopped for the moment, the receiver answers x
// DIVERGED too, and marks the stream as the owner would. Without the mark,
// once the sink was spawned again, y of the old epoch, chained to the
// watermark (prev 3), ran there:
//   - "respawned mid-emission": the sink comes back between x and y of the
//     same emission (a redeploy): y ran before w and x, which ran only
//     later in the new epoch (out of order);
//   - "stray copy after the new epoch": the new epoch ran w, x, y; a copy
//     of the old epoch's y that was still on its way (through a forwarder)
//     arrives: y ran a second time.
func TestAbsentActorDivergedClosesTheOldEpoch(t *testing.T) {
	for _, absent := range []bool{false, true} {
		name := "actor present"
		if absent {
			name = "actor absent"
		}
		t.Run(name+"/respawned mid-emission", func(t *testing.T) { absentMark(t, absent, false) })
		t.Run(name+"/stray copy after the new epoch", func(t *testing.T) { absentMark(t, absent, true) })
	}
}

func absentMark(t *testing.T, absent, stray bool) {
	n, s, rs := ranABC(t, absent)
	respawn := func() {
		t.Helper()
		if absent {
			if _, err := n.Spawn("sink", s.handler); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The restored sender's emission in the old epoch (0).
	w, x, y := stringEnv(t, 2, 1, "w"), stringEnv(t, 3, 2, "x"), stringEnv(t, 4, 3, "y")
	codes := []pb.Receipt_Code{rs.deliverWait(t, n, w).GetCode(), rs.deliverWait(t, n, x).GetCode()}
	if codes[1] != pb.Receipt_DIVERGED {
		t.Fatalf("x at the watermark with other contents: %v, want DIVERGED", codes[1])
	}
	if !stray {
		respawn() // between x and y
	}
	codes = append(codes, rs.deliverWait(t, n, y).GetCode())
	t.Logf("old epoch: w %v, x %v, y %v", codes[0], codes[1], codes[2])
	if stray {
		respawn()
	}
	// The sender, told DIVERGED, acks only what came back PROCESSED and
	// sends the rest again in a new epoch.
	var again []string
	prev := uint64(0)
	for i, e := range []*struct {
		seq uint64
		v   string
	}{{2, "w"}, {3, "x"}, {4, "y"}} {
		if codes[i] == pb.Receipt_PROCESSED {
			continue // acked
		}
		env := stringEnv(t, e.seq, prev, e.v)
		env.StreamEpoch = 7
		env.MsgId = fmt.Sprintf("%s-%d-e7", e.v, e.seq)
		if rc := rs.deliverWait(t, n, env); rc.GetCode() != pb.Receipt_PROCESSED {
			t.Fatalf("%s in the new epoch: %v", e.v, rc.GetCode())
		}
		again = append(again, e.v)
		prev = e.seq
	}
	if stray {
		// A copy of the old epoch's y, sent earlier, arrives now.
		cp := stringEnv(t, 4, 3, "y")
		cp.MsgId = "y-4-copy"
		rc := rs.deliverWait(t, n, cp)
		t.Logf("stray old-epoch copy of y: %v", rc.GetCode())
	}
	want := []string{"a", "b", "c", "w", "x", "y"}
	testutil.WaitFor(t, 5*time.Second, "sink ran the new epoch", func() bool { return len(s.values()) >= len(want) })
	got := s.values()
	t.Logf("resent in the new epoch: %v; sink ran %v", again, got)
	if !slices.Equal(got, want) {
		t.Fatalf("sink ran %v, want %v: the old epoch of a stream answered DIVERGED while its actor was away was not marked, and ran y once the actor was back", got, want)
	}
}

// The mark, seen from a sender that could not store its new epoch (it
// resends in the old one) and whose x left its queue meanwhile (a newer
// version under x's coalesce key, sequence 5): its next emission in the
// old epoch is w (2) and x' (5). The stream is marked, with the sink there
// or not, and w is answered DIVERGED; answered DUPLICATE, a sender reading
// receipts through a forwarder (no watermark digest; watermark 3, at most
// its emitted high-water, between w and x') took it for delivered: w
// acked, never run.
func TestOldEpochCopiesAfterAnAbsentActorsDivergedAreDiverged(t *testing.T) {
	for _, absent := range []bool{false, true} {
		name := "actor present"
		if absent {
			name = "actor absent"
		}
		t.Run(name, func(t *testing.T) {
			n, s, rs := ranABC(t, absent)
			w, x := stringEnv(t, 2, 1, "w"), stringEnv(t, 3, 2, "x")
			rs.deliverWait(t, n, w)
			if rc := rs.deliverWait(t, n, x); rc.GetCode() != pb.Receipt_DIVERGED {
				t.Fatalf("x: %v, want DIVERGED", rc.GetCode())
			}
			w2 := stringEnv(t, 2, 1, "w")
			w2.MsgId = "w-2-again"
			x2 := stringEnv(t, 5, 2, "x'")
			rw, rx := rs.deliverWait(t, n, w2), rs.deliverWait(t, n, x2)
			t.Logf("old epoch again: w %v (watermark %d), x' %v", rw.GetCode(), rw.GetWatermark(), rx.GetCode())
			if rw.GetCode() == pb.Receipt_DUPLICATE {
				t.Fatalf("w, a new message of a stream found divergent, answered DUPLICATE (watermark %d): acknowledged as delivered, it never ran (sink ran %v)", rw.GetWatermark(), s.values())
			}
		})
	}
}

// ranABC starts a node whose sink ran a, b, c (sequences 1 to 3) of one
// stream, and stops the sink if absent.
func ranABC(t *testing.T, absent bool) (*node.Node, *sink, *receipts) {
	t.Helper()
	s, rs := &sink{}, &receipts{}
	n := newNode(t, "n1", t.TempDir(), func(*node.Config) {})
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"a", "b", "c"} {
		seq := uint64(i + 1)
		if rc := rs.deliverWait(t, n, stringEnv(t, seq, seq-1, v)); rc.GetCode() != pb.Receipt_PROCESSED {
			t.Fatalf("%s: %v", v, rc.GetCode())
		}
	}
	if absent {
		if err := n.Stop("sink"); err != nil {
			t.Fatal(err)
		}
	}
	return n, s, rs
}

package node

import "testing"

// refusals counts what it keeps per sender node through every way a
// refusal goes (passed by the watermark, in part or whole; expired;
// refused twice under one sequence), so the per-sender bound frees as
// refusals go, and keeps nothing past it.
func TestRefusalsCountWhatTheyKeepPerSender(t *testing.T) {
	var r refusals
	check := func(what string, msgs, streams int) {
		t.Helper()
		if m, s := r.kept(); m != msgs || s != streams {
			t.Fatalf("%s: %d refusals of %d streams kept, want %d of %d", what, m, s, msgs, streams)
		}
		sum := 0
		for _, k := range r.perPeer {
			sum += k
		}
		if sum != msgs {
			t.Fatalf("%s: the senders' counts add up to %d, want %d", what, sum, msgs)
		}
	}
	for seq := uint64(1); seq <= 10; seq++ {
		r.note("s1", "p", seq, seq, 100)
	}
	r.note("s1", "p", 5, 5, 100) // a copy: nothing more
	r.note("s2", "q", 3, 3, 50)
	check("noted", 11, 2)
	if r.passed("s1", 4, 4) {
		t.Fatal("the message refused under 4 taken for another")
	}
	check("4 passed", 7, 2)
	r.note("s1", "p", 6, 66, 100) // another message under 6
	if !r.passed("s1", 6, 6) {
		t.Fatal("a sequence refused with two contents matched one of them")
	}
	check("6 passed", 5, 2)
	if r.passed("s1", 10, 10) || !r.at("s2", 3) || r.at("s1", 10) {
		t.Fatal("wrong after the watermark passed all of s1")
	}
	check("all of s1 passed", 1, 1)
	r.expire(60)
	check("s2 expired", 0, 0)
	if len(r.perPeer) != 0 {
		t.Fatalf("senders with nothing kept still counted: %v", r.perPeer)
	}
	// Past the per-sender bound nothing more is kept.
	for i := 0; i < maxRefusedPerPeer/maxRefused+1; i++ {
		key := string(rune('A' + i))
		for seq := uint64(1); seq <= maxRefused; seq++ {
			r.note(key, "p", seq, seq, 100)
		}
	}
	check("past the bound", maxRefusedPerPeer, maxRefusedPerPeer/maxRefused)
	r.note("other", "q", 1, 1, 100) // another sender keeps its own
	check("another sender", maxRefusedPerPeer+1, maxRefusedPerPeer/maxRefused+1)
}

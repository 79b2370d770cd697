package node

import (
	"runtime"
	"testing"

	"github.com/meshnode/meshnode/outbox"
)

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
		if want := msgs + streams*refusedStreamWeight; sum != want {
			t.Fatalf("%s: the senders' counts add up to %d, want %d", what, sum, want)
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
	digest := func(d uint64) func() uint64 { return func() uint64 { return d } }
	if r.passed("s1", 10, 10) || !r.other("s2", 3, digest(4)) || r.other("s2", 3, digest(3)) || r.other("s1", 10, digest(11)) {
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
	full := maxRefusedPerPeer / (maxRefused + refusedStreamWeight)
	check("past the bound", full*maxRefused, full)
	r.note("other", "q", 1, 1, 100) // another sender keeps its own
	check("another sender", full*maxRefused+1, full+1)
}

// What refusals keeps for one sender node at its bound stays near a
// MiB also when the sender spreads its refusals one to a stream (it
// picks its streams' epochs: a hostile member, or one restored again and
// again): each stream's own keeping (its key, entry and set) counts
// against the bound, not only its refusals.
func TestRefusalsOfOneSenderStayNearAMiB(t *testing.T) {
	var r refusals
	var id [16]byte
	copy(id[:], "outbox-of-p-0001")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range maxRefusedPerPeer {
		r.note(string(outbox.StreamKey("p", id, uint64(i)+1, "inbox")), "p", 3, uint64(i)+1, 100)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	msgs, streams := r.kept()
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d refusals of %d streams of one sender: heap +%.2f MiB", msgs, streams, float64(grew)/(1<<20))
	if streams == 0 || grew > 2<<20 {
		t.Errorf("one sender's refusals, one to a stream, at their bound: %d streams hold %.2f MiB", streams, float64(grew)/(1<<20))
	}
	runtime.KeepAlive(&r)
}

// A stream whose watermark passes its kept refusals one at a time (a
// healthy flood's refused tail, sent again and run) must not keep the
// array of those it passed: what a stream keeps is what its remaining
// refusals take, since the per-sender bound counts refusals. 256 streams
// of 1,024 refusals, all but the last of each passed, hold well under
// 512 KiB (arrays never compacted would hold 4 MiB).
func TestPassedRefusalsDoNotPinTheirArrays(t *testing.T) {
	const streams, perStream = 256, 1024
	var r refusals
	var id [16]byte
	keys := make([]string, streams)
	for i := range keys {
		keys[i] = string(outbox.StreamKey("p", id, uint64(i)+1, "inbox"))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, k := range keys {
		for seq := uint64(1); seq <= perStream; seq++ {
			r.note(k, "p", seq, seq, 100)
		}
		// The watermark passes them one at a time (each sent again and
		// run, as a healthy flood's refused tail is), but the last.
		for seq := uint64(1); seq < perStream; seq++ {
			if r.passed(k, seq, seq) {
				t.Fatal("a copy taken for another message")
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	msgs, n := r.kept()
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d refusals kept of %d streams: heap +%.1f MiB", msgs, n, float64(grew)/(1<<20))
	if grew > 512<<10 {
		t.Errorf("%d refusals kept (one a stream) hold %.1f MiB: each stream's passed array is pinned by its last refusal", msgs, float64(grew)/(1<<20))
	}
	runtime.KeepAlive(&r)
}

package transport_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/encoding/protowire"
)

// An envelope whose frame is exactly the peer's MaxFrameSize, and holds
// nothing but its sender and recipient (Send requires no more), would
// need a RouteName frame two bytes longer than its own (the ref's tag
// and value), past the peer's limit: its route goes in full, and it and
// the next envelope arrive.
func TestRouteAtThePeersFrameLimitGoesInFull(t *testing.T) {
	ca, r := newCA(t), newResolver()
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	cfg := testConfig(t, ca, "b")
	cfg.MaxFrameSize = 1024
	rec := &recorder{}
	startNode(t, cfg, r, rec)

	// inner = 1 + SizeVarint(envLen) + envLen = 1024: envLen = 1021 =
	// (3 + len(sender)) + (3 + len(recipient)).
	sender := strings.Repeat("s", 500) + "@a"
	recipient := strings.Repeat("r", 1021-6-len(sender)-2) + "@b"
	env := &pb.Envelope{Sender: sender, Recipient: recipient}
	b, err := transport.AppendEnvelopeFrame(nil, env, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	_, n := protowire.ConsumeVarint(b)
	if inner := len(b) - n; inner != 1024 {
		t.Fatalf("frame of %d bytes, want 1024", inner)
	}
	ctx := ctxT(t, 10*time.Second)
	if err := a.Send(ctx, "b", env); err != nil {
		t.Fatal(err)
	}
	id := transport.ConnID(a.Transport, "b")
	// A follow-up on the same lane, to know the first was read or lost.
	next := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "next", Sender: "x@a", Recipient: recipient}
	if err := a.Send(ctx, "b", next); err != nil {
		t.Fatal(err)
	}
	pollFor(5*time.Second, func() bool { return rec.count.Load() >= 2 })
	got, _ := rec.snapshot()
	var ids []string
	for _, e := range got {
		ids = append(ids, e.GetMsgId())
	}
	if len(got) != 2 || got[0].GetSender() != sender || got[0].GetRecipient() != recipient {
		t.Fatalf("b got %v (conn id before %d, now %d); logs:\n%s", ids, id, transport.ConnID(a.Transport, "b"), a.logs.String())
	}
}

// pollFor polls f every 5 ms until it holds or d has passed, and says
// whether it held: for a test that reports more than waitCond's message
// when it does not.
func pollFor(d time.Duration, f func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !f() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

package node_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/rawpeer"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/transport"
	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Attacks of a member: "evil" holds a valid certificate of the cluster CA
// and speaks the protocol by hand (internal/rawpeer).

func target(n *node.Node) rawpeer.Target {
	return rawpeer.Target{Addr: n.QUICAddr(), Name: n.Name(), Cluster: "test"}
}

func strBody(tb testing.TB, s string) *anypb.Any {
	tb.Helper()
	a, err := anypb.New(wrapperspb.String(s))
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// nextIDs guesses the ids a node makes after seen, as they were made
// before ids were encrypted: 11 digits of per-process prefix, then an
// 11-digit counter.
func nextIDs(seen string, k int) []string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	var ctr uint64
	for _, c := range seen[11:] {
		ctr = ctr<<6 | uint64(strings.IndexRune(alphabet, c))
	}
	out := make([]string, k)
	for i := range out {
		v := ctr + uint64(i) + 1
		var b [11]byte
		for j := 10; j >= 0; j-- {
			b[j] = alphabet[v&63]
			v >>= 6
		}
		out[i] = seen[:11] + string(b[:])
	}
	return out
}

// spawnEcho spawns "echo" on n: it answers "genuine: <request>" and counts
// the requests it ran.
func spawnEcho(tb testing.TB, n *node.Node, runs *atomic.Int64, onRun func(*node.Message)) node.Address {
	tb.Helper()
	to, err := n.Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		runs.Add(1)
		if onRun != nil {
			onRun(m)
		}
		var req wrapperspb.StringValue
		if err := m.Decode(&req); err != nil {
			return nil, err
		}
		return wrapperspb.String("genuine: " + req.GetValue()), nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return to
}

// TestForgedAskRepliesRefused: a member that has seen one of n1's ids
// floods n1 with RESPONSEs for the ids it expects next, and also sends
// n2's echo REQUESTs whose reply_to names n1 under those ids (so that n2
// itself, with its genuine identity, answers n1). n1's next Ask of
// echo@n2 must return n2's real answer.
func TestForgedAskRepliesRefused(t *testing.T) {
	nodes := cluster(t, 2)
	n1, n2 := nodes[0], nodes[1]
	var runs, reflected, own atomic.Int64
	echo := spawnEcho(t, n2, &runs, func(m *node.Message) {
		var s wrapperspb.StringValue
		_ = m.Decode(&s)
		switch s.GetValue() {
		case "reflected":
			reflected.Add(1)
		case "own":
			own.Add(1)
		}
	})

	evilAt1 := rawpeer.Dial(t, testCA(t), "evil", target(n1))
	evilAt2 := rawpeer.Dial(t, testCA(t), "evil", target(n2))
	seen := mailbox.NewID() // made by this process, as n1's are: what a member sees of n1
	guesses := nextIDs(seen, 300)
	lane1, lane2 := evilAt1.Lane(t), evilAt2.Lane(t)
	for _, id := range guesses {
		evilAt1.Send(t, lane1, &pb.Envelope{
			ProtocolVersion: pb.ProtocolVersion, MsgId: "f-" + id, Sender: "echo@n2", Recipient: "@n1",
			Rpc:  &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, CorrelationId: id},
			Body: strBody(t, "forged"),
		})
		evilAt2.Send(t, lane2, &pb.Envelope{
			ProtocolVersion: pb.ProtocolVersion, MsgId: "r-" + id, Sender: "@evil", Recipient: "echo@n2",
			Rpc:  &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, CorrelationId: id, ReplyTo: "@n1"},
			Body: strBody(t, "reflected"),
		})
	}
	// n2 has judged every reflected request by the time it answers a
	// request of the evil peer's own that came after them on the same lane.
	evilAt2.Send(t, lane2, &pb.Envelope{
		ProtocolVersion: pb.ProtocolVersion, MsgId: "last", Sender: "@evil", Recipient: "echo@n2",
		Rpc:  &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, CorrelationId: "last", ReplyTo: "@evil"},
		Body: strBody(t, "own"),
	})
	testutil.WaitFor(t, 10*time.Second, "n2 ran the evil peer's own request", func() bool { return own.Load() == 1 })
	if got := reflected.Load(); got != 0 {
		t.Errorf("echo ran %d requests whose reply_to named n1; they must not run", got)
	}
	if got := n2.Stats().SenderMismatch; got != uint64(len(guesses)) {
		t.Errorf("n2 counted %d refused claims, want %d", got, len(guesses))
	}

	for i := 0; i < 5; i++ {
		var reply wrapperspb.StringValue
		if err := n1.Ask(ctxT(t), echo, wrapperspb.String(fmt.Sprint("q", i)), &reply); err != nil {
			t.Fatalf("ask %d: %v", i, err)
		}
		if want := fmt.Sprint("genuine: q", i); reply.GetValue() != want {
			t.Fatalf("ask %d returned %q, want %q: a forged reply was accepted", i, reply.GetValue(), want)
		}
	}
}

// TestResponseFromAnotherMemberRefused: even with the exact correlation
// id (here handed to it by the test, as if it had seen it), a member other
// than the one asked cannot answer the ask.
func TestResponseFromAnotherMemberRefused(t *testing.T) {
	nodes := cluster(t, 2)
	n1, n2 := nodes[0], nodes[1]
	evil := rawpeer.Dial(t, testCA(t), "evil", target(n1))
	lane := evil.Lane(t)
	var runs atomic.Int64
	var forgeOnce sync.Once
	echo := spawnEcho(t, n2, &runs, func(m *node.Message) {
		forgeOnce.Do(func() {
			evil.Send(t, lane, &pb.Envelope{
				ProtocolVersion: pb.ProtocolVersion, MsgId: "forged", Sender: "echo@n2", Recipient: "@n1",
				Rpc:  &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, CorrelationId: m.Envelope().GetRpc().GetCorrelationId()},
				Body: strBody(t, "forged"),
			})
			// Answer only once n1 has judged the forgery.
			testutil.WaitFor(t, 10*time.Second, "n1 refused the forged response", func() bool { return n1.Stats().ResponsesRefused == 1 })
		})
	})
	var reply wrapperspb.StringValue
	if err := n1.Ask(ctxT(t), echo, wrapperspb.String("q"), &reply); err != nil {
		t.Fatal(err)
	}
	if reply.GetValue() != "genuine: q" {
		t.Fatalf("ask returned %q: a forged reply was accepted", reply.GetValue())
	}
}

// TestSenderIsTheVerifiedPeer: a member cannot make its messages appear
// to come from another node. An envelope that names another node is
// refused (a reliable one with a REJECTED receipt); the handler sees only
// messages whose sender's node is the one TLS verified.
func TestSenderIsTheVerifiedPeer(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	type seen struct {
		sender node.Address
		from   string
		body   string
	}
	got := make(chan seen, 16)
	if _, err := n.Spawn("billing", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var s wrapperspb.StringValue
		_ = m.Decode(&s)
		got <- seen{m.Sender(), m.From(), s.GetValue()}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	evil := rawpeer.Dial(t, testCA(t), "evil", target(n))
	lane := evil.Lane(t)
	for _, sender := range []string{"billing@n1", "admin@n2", "@n1", ""} {
		evil.Send(t, lane, &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "tell " + sender,
			Sender: sender, Recipient: "billing@n1", Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_EVENT}, Body: strBody(t, "forged")})
	}
	// A reliable one is answered REJECTED.
	evil.Send(t, lane, &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "stream", Sender: "billing@n1",
		Recipient: "billing@n1", Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_EVENT}, Body: strBody(t, "forged"),
		Sequence: 1, Attempt: 1, Receipt: pb.Envelope_RECEIPT_PROCESSED})
	rc, err := evil.Receipt(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if rc.GetMsgId() != "stream" || rc.GetCode() != pb.Receipt_REJECTED {
		t.Fatalf("receipt %v, want REJECTED for the forged stream message", rc)
	}
	// The evil peer's honest message goes through, under its own name.
	evil.Send(t, lane, &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "honest", Sender: "worker@evil",
		Recipient: "billing@n1", Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_EVENT}, Body: strBody(t, "honest")})
	select {
	case s := <-got:
		if s.body != "honest" || s.sender != node.Addr("worker", "evil") || s.from != "evil" {
			t.Fatalf("handler saw %+v, want only the honest message from worker@evil", s)
		}
	case <-ctxT(t).Done():
		t.Fatal("the honest message never arrived")
	}
	if st := n.Stats(); st.SenderMismatch != 5 {
		t.Fatalf("SenderMismatch = %d, want 5", st.SenderMismatch)
	}
}

// TestMailboxMemoryChargedToPeer: a member floods actors that are busy
// with large messages. Each mailbox holds at most its byte bound, and the
// flooder's messages together at most PeerQueuedBytes, past which its
// messages are refused as "full" while another peer's still get in.
func TestMailboxMemoryChargedToPeer(t *testing.T) {
	const mib = 1 << 20
	n1 := startNodeWith(t, "n1", t.TempDir(), func(c *node.Config) {
		c.MailboxBytes, c.PeerQueuedBytes = 4*mib, 6*mib
	})
	n2 := startNode(t, "n2", t.TempDir(), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	var ran atomic.Int64
	for _, a := range []string{"a1", "a2", "a3"} {
		if _, err := n1.Spawn(a, func(ctx context.Context, m *node.Message) (proto.Message, error) {
			<-release
			ran.Add(1)
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	var marker atomic.Int64
	if _, err := n1.Spawn("marker", func(context.Context, *node.Message) (proto.Message, error) {
		marker.Add(1)
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	heapBefore := heapInUse()
	evil := rawpeer.Dial(t, testCA(t), "evil", target(n1))
	lane := evil.Lane(t)
	big := &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.BytesValue", Value: make([]byte, mib)}
	const flood = 40
	for i := 0; i < flood; i++ {
		evil.Send(t, lane, &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprint("big", i), Sender: "@evil",
			Recipient: fmt.Sprintf("a%d@n1", 1+i%2), Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_EVENT}, Body: big})
	}
	evil.Send(t, lane, &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "marker", Sender: "@evil",
		Recipient: "marker@n1", Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_EVENT}})
	testutil.WaitFor(t, 20*time.Second, "the flood was judged", func() bool { return marker.Load() == 1 })

	var queued int64
	for _, st := range n1.ActorStats() {
		if st.MaxBytes != 4*mib {
			t.Fatalf("%s: MaxBytes %d, want the configured %d", st.Name, st.MaxBytes, 4*mib)
		}
		if st.Bytes > st.MaxBytes+mib+4096 {
			t.Fatalf("%s holds %d bytes, bound %d plus one message", st.Name, st.Bytes, st.MaxBytes)
		}
		queued += st.Bytes
	}
	if queued > 6*mib+mib+8192 {
		t.Fatalf("the flooder has %d bytes queued, bound %d plus one message", queued, 6*mib)
	}
	if st := n1.Stats(); st.RefusedPeerBytes == 0 {
		t.Fatal("no message was refused for the flooder's bound")
	}
	if grown := heapInUse() - heapBefore; grown > 40*mib {
		t.Fatalf("heap grew by %d MiB after a flood of %d MiB", grown/mib, flood)
	}
	// Another peer's large message still gets into a3.
	if err := n2.Tell(ctxT(t), node.Addr("a3", "n1"), wrapperspb.Bytes(make([]byte, mib))); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "n2's message queued at a3", func() bool {
		for _, st := range n1.ActorStats() {
			if st.Name == "a3" {
				return st.Running || st.Depth > 0
			}
		}
		return false
	})
	releaseOnce.Do(func() { close(release) })
	testutil.WaitFor(t, 10*time.Second, "queued messages handled", func() bool {
		for _, st := range n1.ActorStats() {
			if st.Depth > 0 || st.Bytes != 0 {
				return false
			}
		}
		return true
	})
}

func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// TestRefusedStrangersCounted: a QUIC client with a certificate of
// another CA, or none, is refused by the node and shows in its Stats.
func TestRefusedStrangersCounted(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	foreign, err := transport.NewCA("another cluster", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := foreign.NewIdentity("stranger")
	if err != nil {
		t.Fatal(err)
	}
	own, err := testCA(t).NewIdentity("client")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []transport.Identity{stranger, {}} {
		id.Roots = own.Roots // the stranger trusts the node: only its own side is wrong
		qc, err := quic.DialAddr(ctxT(t), n.QUICAddr(), rawpeer.ClientTLS(id, "n1"), &quic.Config{HandshakeIdleTimeout: 2 * time.Second})
		if err == nil {
			<-qc.Context().Done()
			_ = qc.CloseWithError(0, "")
		}
	}
	testutil.WaitFor(t, 5*time.Second, "refusals counted", func() bool {
		r := n.Stats().Refused
		return r.UnknownCA == 1 && r.NoCertificate == 1
	})
}

// TestAskerThatStopsReadingDoesNotHoldTheActor: a member asks for large
// replies with an hour's TTL and never reads them, so the responder's
// send queue to it stays full. A response waits for room only while the
// queue drains and at most a second: the actor goes on, and an honest
// asker queued behind is answered.
func TestAskerThatStopsReadingDoesNotHoldTheActor(t *testing.T) {
	nodes := clusterWith(t, 2, func(i int, cfg *node.Config) { cfg.Transport.SendQueueSize = 4 })
	n1, n2 := nodes[0], nodes[1]
	big := wrapperspb.String(strings.Repeat("x", 200<<10))
	var evilRuns atomic.Int64
	if _, err := n2.Spawn("big", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		if m.Sender().Node == "evil" {
			evilRuns.Add(1)
		}
		return big, nil
	}, node.WithMailbox(256, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	evil := rawpeer.Dial(t, testCA(t), "evil", target(n2))
	lane := evil.Lane(t)
	const asks = 40
	for i := range asks {
		evil.Send(t, lane, &pb.Envelope{
			ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("e-%d", i), Sender: "@evil", Recipient: "big@n2",
			TtlMs: time.Hour.Milliseconds(),
			Rpc:   &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, CorrelationId: fmt.Sprintf("e-%d", i), ReplyTo: "@evil"},
			Body:  strBody(t, "q"),
		})
	}
	testutil.WaitFor(t, 10*time.Second, "the actor took the evil peer's asks", func() bool { return evilRuns.Load() >= 10 })
	ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Second)
	defer cancel()
	var reply wrapperspb.StringValue
	if err := n1.Ask(ctx, node.Addr("big", n2.Name()), wrapperspb.String("q"), &reply); err != nil {
		t.Fatalf("an honest ask behind a non-reading asker's: %v (the actor ran %d of its %d asks)", err, evilRuns.Load(), asks)
	}
}

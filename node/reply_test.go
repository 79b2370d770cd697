package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestReplyOnlyToTheSendersNode: a reliable request is answered only when
// its reply-to actor is on the node that sent it (as TLS verified it);
// one naming another node runs, but stores no reply.
func TestReplyOnlyToTheSendersNode(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) {
		return wrapperspb.String("result"), nil
	}); err != nil {
		t.Fatal(err)
	}
	body, err := anypb.New(wrapperspb.String("req"))
	if err != nil {
		t.Fatal(err)
	}
	var rs receipts
	for i, replyTo := range []string{"replies@n3", "replies@p"} {
		env := streamEnv("a", "n1", uint64(i+1), uint64(i))
		env.Body = body
		env.Rpc = &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, ReplyTo: replyTo, CorrelationId: "c" + replyTo}
		n.DeliverIncoming(peerP, env, rs.reply(env.GetMsgId()))
		testutil.WaitFor(t, 5*time.Second, "request "+replyTo+" processed", func() bool {
			return rs.code(env.GetMsgId()) == pb.Receipt_PROCESSED
		})
		want := map[string]int{"replies@n3": 0, "replies@p": 1}[replyTo]
		st := n.Outbox().Stats()
		if got := st.DepthByPeer["p"] + st.DepthByPeer["n3"]; got != want {
			t.Fatalf("reply-to %s: %d replies stored (%v), want %d", replyTo, got, st.DepthByPeer, want)
		}
	}
}

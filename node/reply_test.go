package node_test

import (
	"context"
	"fmt"
	"sync/atomic"
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
// its reply-to actor is on the node that sent it (as TLS verified it); one
// naming another node is refused REJECTED before its handler runs, and no
// reply is stored for anyone.
func TestReplyOnlyToTheSendersNode(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	var runs atomic.Int32
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) {
		runs.Add(1)
		return wrapperspb.String("result"), nil
	}); err != nil {
		t.Fatal(err)
	}
	body, err := anypb.New(wrapperspb.String("req"))
	if err != nil {
		t.Fatal(err)
	}
	var rs receipts
	for i, tc := range []struct {
		replyTo string
		code    pb.Receipt_Code
		runs    int32
		stored  int
	}{
		{"replies@n3", pb.Receipt_REJECTED, 0, 0},
		{"replies@p", pb.Receipt_PROCESSED, 1, 1},
	} {
		env := streamEnv("a", "n1", 1, 0)
		env.MsgId = fmt.Sprintf("m%d", i)
		env.Body = body
		env.Rpc = &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, ReplyTo: tc.replyTo, CorrelationId: "c" + tc.replyTo}
		n.DeliverIncoming(peerP, env, rs.reply(env.GetMsgId()))
		testutil.WaitFor(t, 5*time.Second, "request "+tc.replyTo+" answered", func() bool {
			return rs.code(env.GetMsgId()) == tc.code
		})
		if got := runs.Load(); got != tc.runs {
			t.Fatalf("reply-to %s: handler ran %d times in all, want %d", tc.replyTo, got, tc.runs)
		}
		st := n.Outbox().Stats()
		if got := st.DepthByPeer["p"] + st.DepthByPeer["n3"]; got != tc.stored {
			t.Fatalf("reply-to %s: %d replies stored (%v), want %d", tc.replyTo, got, st.DepthByPeer, tc.stored)
		}
	}
}

package node_test

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Two different reliable requests from n1 to two different actors of n2
// ("billing" and "shipping"), each with the application's own id of the
// request as its correlation id, and the ids happen to be equal (each
// service numbers its own requests). The requester scopes reply keys by
// (responding node, reply-to actor) only, so a reply's key must name the
// responding actor: with the correlation id alone the two replies shared a
// key, the second was answered DUPLICATE and never ran, and one reply,
// acknowledged, was lost.
func TestRepliesOfDifferentActorsDoNotShareAKey(t *testing.T) {
	nodes := cluster(t, 2)
	n1, n2 := nodes[0], nodes[1]
	for _, name := range []string{"billing", "shipping"} {
		if _, err := n2.Spawn(name, func(_ context.Context, m *node.Message) (proto.Message, error) {
			return wrapperspb.String(name + " done"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var replies []string
	if _, err := n1.Spawn("replies", func(_ context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, node.Permanent(err)
		}
		mu.Lock()
		replies = append(replies, m.CorrelationID()+":"+v.GetValue())
		mu.Unlock()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"billing", "shipping"} {
		if _, err := n1.TellReliable(ctxT(t), node.Addr(name, "n2"), wrapperspb.String("order 7"),
			node.WithReplyTo(node.Addr("replies", "n1")), node.WithCorrelationID("7")); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 15*time.Second, "both replies acknowledged", func() bool { return n2.Outbox().Stats().Depth == 0 })
	mu.Lock()
	got := append([]string(nil), replies...)
	mu.Unlock()
	sort.Strings(got)
	if strings.Join(got, ",") != "7:billing done,7:shipping done" {
		t.Fatalf("replies run at the requester: %v, want both billing's and shipping's", got)
	}
}

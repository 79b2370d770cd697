package mailbox

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// RegisterChan of an id whose response arrived early puts it in the
// caller's channel under the shard's lock. A channel the caller filled
// after RegisterChan checked it was empty must not block there: the whole
// shard (Deliver, Cancel, Register, Prune) would hang with it.
func TestRegisterChanNeverBlocksOnAnEarlyResponse(t *testing.T) {
	r, err := NewResponseRegistry(DefaultRegistryConfig())
	if err != nil {
		t.Fatal(err)
	}
	const id = "early"
	r.Deliver("n2", &pb.Envelope{MsgId: "r", Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, CorrelationId: id}})
	if _, early := r.Len(); early != 1 {
		t.Fatalf("%d early responses, want 1", early)
	}
	ch := make(chan *pb.Envelope, 1)
	s := r.shard(id)
	s.mu.Lock() // RegisterChan checks ch, then waits here
	done := make(chan error, 1)
	go func() { done <- r.RegisterChan(id, "n2", ch) }()
	testutil.WaitFor(t, 5*time.Second, "RegisterChan waiting for the shard's lock", func() bool {
		buf := make([]byte, 1<<20)
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "RegisterChan") && strings.Contains(g, "sync.(*Mutex).Lock") {
				return true
			}
		}
		return false
	})
	ch <- &pb.Envelope{MsgId: "the caller's own"}
	s.mu.Unlock()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("RegisterChan into a full channel = nil")
		}
	case <-time.After(5 * time.Second):
		<-ch // let it end
		t.Fatal("RegisterChan blocked on a channel the caller filled, holding the shard's lock")
	}
	if got := (<-ch).GetMsgId(); got != "the caller's own" {
		t.Fatalf("the channel holds %q, want what the caller put in it", got)
	}
}

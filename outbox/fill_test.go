package outbox_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/outbox"
)

// A queue's records are appended in sequence order, so a page a commit
// leaves behind takes no more records: its pages must be packed, not split
// half empty (bbolt's default), or a commit writes, and a backlog keeps,
// twice the pages.
func TestQueuePagesArePacked(t *testing.T) {
	e := open(t, nil)
	body, err := anypb.New(wrapperspb.Bytes(make([]byte, 128)))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4000 {
		sm := e.msg(t, "a@n1", "t")
		sm.Envelope.Body = body
		wg.Add(1)
		err := e.EnqueueAsync(context.Background(), sm, func(_ outbox.Result, err error) {
			defer wg.Done()
			if err != nil {
				t.Error(err)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if fill := testutil.LeafFill(t, e.path, "q", "a@n1"); fill < 0.8 {
		t.Fatalf("the queue's leaf pages are %.0f%% full, want at least 80%%", 100*fill)
	}
}

package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/outbox"
)

// Queue records are appended in sequence order, whatever their
// recipients, so a page a commit leaves behind takes no more records: the
// pages must be packed, not split half empty (bbolt's default), or a
// commit writes, and a backlog keeps, twice the pages.
func TestQueuePagesArePacked(t *testing.T) {
	e := open(t, nil)
	body, err := anypb.New(wrapperspb.Bytes(make([]byte, 128)))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4000 {
		sm := e.msg(t, fmt.Sprintf("a%d@n1", i%4), "t")
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
	if fill := testutil.LeafFill(t, e.path, "m"); fill < 0.8 {
		t.Fatalf("the queue records' leaf pages are %.0f%% full, want at least 80%%", 100*fill)
	}
}

package node_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A tell or an ask from a peer is reused (its envelope, and a tell's
// Message) once its handler returns, as is an ask's response once Ask has
// read it. What a handler read stays as it was while later messages reuse
// the memory: the id, the headers map and a header's value, the body's
// bytes, a decoded copy; and every asker gets its own reply.
func TestValuesOutliveTheirMessage(t *testing.T) {
	for _, ask := range []bool{false, true} {
		t.Run(map[bool]string{false: "tell", true: "ask"}[ask], func(t *testing.T) {
			checkValuesOutliveTheirMessage(t, ask)
		})
	}
}

func checkValuesOutliveTheirMessage(t *testing.T, ask bool) {
	nodes := cluster(t, 2)
	type kept struct {
		id, header, value string
		headers           map[string]string
		body              []byte
	}
	var mu sync.Mutex
	var got []kept
	to, err := nodes[1].Spawn("keep", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, kept{id: m.ID(), header: m.Headers()["n"], value: v.GetValue(), headers: m.Headers(), body: m.Envelope().GetBody().GetValue()})
		return wrapperspb.String("re " + v.GetValue()), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	const batches, per = 20, 100
	for b := range batches {
		var wg sync.WaitGroup
		for i := range per {
			n := fmt.Sprint(b*per + i)
			opt := node.WithHeaders(map[string]string{"n": n})
			if !ask {
				if err := nodes[0].Tell(context.Background(), to, wrapperspb.String(n), opt); err != nil {
					t.Fatal(err)
				}
				continue
			}
			wg.Go(func() {
				var re wrapperspb.StringValue
				if err := nodes[0].Ask(context.Background(), to, wrapperspb.String(n), &re, opt); err != nil {
					t.Error(err)
				} else if re.GetValue() != "re "+n {
					t.Errorf("ask %s got the reply %q", n, re.GetValue())
				}
			})
		}
		wg.Wait()
		// A mailbox holds the batch: none is dropped for room.
		testutil.WaitFor(t, 10*time.Second, "the batch handled", func() bool { return count() == (b+1)*per })
	}
	mu.Lock()
	defer mu.Unlock()
	ids := make(map[string]bool)
	for i, k := range got {
		want, err := proto.Marshal(wrapperspb.String(k.value))
		if err != nil {
			t.Fatal(err)
		}
		if k.id == "" || ids[k.id] || k.header != k.value || k.headers["n"] != k.value || len(k.headers) != 1 || !bytes.Equal(k.body, want) {
			t.Fatalf("message %d: what its handler kept changed after it returned: id %q (seen before %v), header %q, headers %v, body % x; value %q",
				i, k.id, ids[k.id], k.header, k.headers, k.body, k.value)
		}
		ids[k.id] = true
	}
}

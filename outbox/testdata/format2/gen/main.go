// Command gen wrote format2.db, an outbox file of format 2 (a bucket per
// queue), and format2.jsonl, what Head returned from it, for the test of
// the migration to format 3. It ran against the outbox package as it was
// when it wrote format 2 (go run ./gen DIR from a checkout of that
// version); testdata is not built with the module.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

func main() {
	dir := os.Args[1]
	path := filepath.Join(dir, "format2.db")
	clk := outbox.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := outbox.DefaultConfig(path)
	cfg.Clock = clk
	s, err := outbox.Open(cfg)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	send := func(r, typ string, ttl int64, key string, hdr map[string]string) uint64 {
		seq, err := s.ReserveSequence()
		if err != nil {
			log.Fatal(err)
		}
		body, _ := anypb.New(wrapperspb.String("body of " + typ))
		env := &pb.Envelope{Recipient: r, Sender: "app@n0", Sequence: seq, Type: typ, Body: body, TtlMs: ttl, Headers: hdr, MsgId: "id-" + typ}
		if key != "" {
			env.Conflict, env.CoalesceKey = pb.Envelope_OVERWRITE, key
		}
		res, err := s.Enqueue(ctx, &pb.StoredMessage{Envelope: env})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintln(os.Stderr, r, typ, seq, res)
		clk.Advance(time.Second)
		return seq
	}
	// Interleaved, so the migration meets every queue more than once.
	for i := range 6 {
		send("a@n1", fmt.Sprint("a", i), 0, "", map[string]string{"i": fmt.Sprint(i)})
		if i < 4 {
			send("b@n1", fmt.Sprint("b", i), int64(20*24*time.Hour/time.Millisecond), "", nil)
		}
		if i < 3 {
			send("c@n2", fmt.Sprint("c", i), 0, "price", nil) // each replaces the one before
		}
	}
	failed := send("d@n2", "d0", 0, "", nil)
	send("d@n2", "d1", 0, "", nil)
	if _, _, err := s.Fail("d@n2", failed, outbox.Failure{Reason: "handler: boom", Counts: true}); err != nil {
		log.Fatal(err)
	}
	gone := send("e@n3", "e0", 0, "", nil)
	if _, err := s.Expire("e@n3", []uint64{gone}, outbox.ReasonExpired); err != nil {
		log.Fatal(err)
	}
	if err := s.SetEpoch("a@n1", 7); err != nil {
		log.Fatal(err)
	}
	var out []byte
	for _, r := range []string{"a@n1", "b@n1", "c@n2", "d@n2", "e@n3"} {
		msgs, _, err := s.Head(outbox.HeadRequest{Recipient: r, Max: 100})
		if err != nil {
			log.Fatal(err)
		}
		for _, m := range msgs {
			j, err := protojson.Marshal(m)
			if err != nil {
				log.Fatal(err)
			}
			out = append(append(out, j...), '\n')
		}
	}
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "format2.jsonl"), out, 0o644); err != nil {
		log.Fatal(err)
	}
}

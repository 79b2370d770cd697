package outbox

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Records written by the generic encoder (header + proto.Marshal, as
// before the record codec, or its fallback today: headers in map
// order, unknown fields, an origin) read back through Head and survive a
// Fail's rewrite.
func TestRecordsOfTheGenericEncoderReadBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "o.db")
	s, err := Open(DefaultConfig(path))
	if err != nil {
		t.Fatal(err)
	}
	now := s.clock.nowMs()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(seq uint64) *pb.StoredMessage {
		return &pb.StoredMessage{
			Envelope: &pb.Envelope{
				Recipient: "a@n1", Sender: "x@n0", Sequence: seq, Type: "t",
				Headers:  map[string]string{"a": "1", "b": "", "": "c", "d": "4", "e": "5"},
				Body:     &anypb.Any{TypeUrl: "u", Value: []byte{0, 1, 2}},
				Rpc:      &pb.RpcMeta{Kind: pb.RpcMeta_Kind(-3), Service: "s"},
				Conflict: pb.Envelope_Conflict(-1), Receipt: pb.Envelope_ReceiptMode(7), TtlMs: 0,
			},
			Attempts: 1, LastError: "e", CreatedElapsedMs: now,
		}
	}
	var want []*pb.StoredMessage
	err = db.Update(func(tx *bolt.Tx) error {
		recs := tx.Bucket(bucketRecords)
		for seq := uint64(1); seq <= 4; seq++ {
			sm := mk(seq)
			switch seq {
			case 2:
				sm.ProtoReflect().SetUnknown([]byte{0x40, 0x01})
			case 3:
				sm.Envelope.Origin = &pb.Origin{Node: "n9", OutboxId: []byte{1}}
			case 4:
				sm.Envelope.ProtoReflect().SetUnknown([]byte{0xb0, 0x02, 0x05}) // field 38
			}
			head := recordHeader(sm.CreatedElapsedMs, 0, 0, "a@n1", 0)
			val, err := proto.MarshalOptions{}.MarshalAppend(head, sm)
			if err != nil {
				return err
			}
			if err := recs.Put(seqKey(seq), val); err != nil {
				return err
			}
			want = append(want, sm)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(DefaultConfig(path)); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, _, err := s.Head(HeadRequest{Recipient: "a@n1", Max: 10})
	if err != nil || len(got) != len(want) {
		t.Fatalf("head: %d, %v", len(got), err)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("record %d:\n got %v\nwant %v", i+1, got[i], want[i])
		}
	}
	for seq := uint64(1); seq <= 4; seq++ {
		if _, _, err := s.Fail("a@n1", seq, Failure{Reason: "r", Counts: false}); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err = s.Head(HeadRequest{Recipient: "a@n1", Max: 10})
	if err != nil || len(got) != len(want) {
		t.Fatalf("head: %d, %v", len(got), err)
	}
	for i := range want {
		want[i].LastError = "r"
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("after fail, record %d:\n got %v\nwant %v", i+1, got[i], want[i])
		}
	}
}

package outbox_test

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// v1Msg is a queued message or dead letter as the first release stored it.
type v1Msg struct {
	seq                  uint64
	recipient, typ, idem string
	overwrite            bool
	firstMs, expiresMs   int64 // wall clock; expiresMs 0 = none
	attempts             uint32
	reason               string // dead letters
}

// v1Bytes encodes m as a StoredMessage of the first release, field by
// field, so the test does not depend on the code that wrote it: the
// envelope still has field 7, expires_at_unix_ms.
func (m v1Msg) v1Bytes() []byte {
	var e []byte
	str := func(b []byte, num protowire.Number, s string) []byte {
		if s == "" {
			return b
		}
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, s)
	}
	varint := func(b []byte, num protowire.Number, v uint64) []byte {
		if v == 0 {
			return b
		}
		b = protowire.AppendTag(b, num, protowire.VarintType)
		return protowire.AppendVarint(b, v)
	}
	e = varint(e, 1, 1) // protocol_version 1
	e = str(e, 2, "msg-"+m.typ)
	e = str(e, 3, m.idem)
	e = str(e, 4, "app@n0")
	e = str(e, 5, m.recipient)
	e = varint(e, 6, uint64(m.firstMs))
	e = varint(e, 7, uint64(m.expiresMs))
	e = str(e, 8, m.typ)
	e = varint(e, 13, m.seq)
	if m.overwrite {
		e = varint(e, 14, 1)
	}
	var sm []byte
	sm = protowire.AppendTag(sm, 1, protowire.BytesType)
	sm = protowire.AppendBytes(sm, e)
	sm = varint(sm, 2, uint64(m.attempts))
	sm = varint(sm, 3, uint64(m.firstMs))
	if m.reason != "" {
		sm = str(sm, 4, "last: "+m.reason)
		sm = varint(sm, 5, uint64(m.firstMs+1000))
		sm = str(sm, 6, m.reason)
	}
	return sm
}

func be(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// writeV1 builds a file of the first format: no "format" key in meta;
// q/<recipient> values are an 8-byte first_enqueued wall ms and the
// StoredMessage; coalesce values are 8-byte sequences; dedupe maps
// "sender>actor" NUL key to an 8-byte wall ms.
func writeV1(tb testing.TB, path string, queued, dead []v1Msg, coalesce map[string]uint64, dedupe map[string]int64, high uint64) {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		bk := map[string]*bolt.Bucket{}
		for _, n := range []string{"q", "coalesce", "dlq", "dedupe", "meta"} {
			b, err := tx.CreateBucket([]byte(n))
			if err != nil {
				return err
			}
			bk[n] = b
		}
		if err := bk["meta"].Put([]byte("seq"), be(high)); err != nil {
			return err
		}
		for _, m := range queued {
			qb, err := bk["q"].CreateBucketIfNotExists([]byte(m.recipient))
			if err != nil {
				return err
			}
			if err := qb.Put(be(m.seq), append(be(uint64(m.firstMs)), m.v1Bytes()...)); err != nil {
				return err
			}
		}
		for i, m := range dead {
			if err := bk["dlq"].Put(be(uint64(i+1)), m.v1Bytes()); err != nil {
				return err
			}
		}
		if err := bk["dlq"].SetSequence(uint64(len(dead))); err != nil { // ids came from NextSequence
			return err
		}
		for k, seq := range coalesce {
			if err := bk["coalesce"].Put([]byte(k), be(seq)); err != nil {
				return err
			}
		}
		for k, ms := range dedupe {
			if err := bk["dedupe"].Put([]byte(k), be(uint64(ms))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// The first format's coalesce index also named newest versions already
// delivered; after the upgrade an older version of one (a dead letter) is
// still refused, and a waiting version is still replaced by a newer one.
func TestMigrateKeepsNewestVersions(t *testing.T) {
	wall := epoch0.UnixMilli()
	base := uint64(epoch0.UnixNano())
	queued := []v1Msg{{seq: base + 2, recipient: "a@n1", typ: "m2", idem: "price", overwrite: true, firstMs: wall - 1000}}
	dead := []v1Msg{{seq: base + 5, recipient: "a@n1", typ: "d1", idem: "gone", overwrite: true, firstMs: wall - 1000, reason: "rejected: x"}}
	coalesce := map[string]uint64{"a@n1\x00price": base + 2, "a@n1\x00gone": base + 10}
	path := filepath.Join(t.TempDir(), "outbox.db")
	writeV1(t, path, queued, dead, coalesce, nil, base+100)
	s := mustOpen(t, config(path, outbox.NewManualClock(epoch0), nil))
	defer s.Close()
	if n, err := s.Replay(outbox.DLQFilter{Reason: "rejected"}); n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replay of a dead letter superseded before the upgrade: %d %v", n, err)
	}
	seq, err := s.ReserveSequence()
	if err != nil {
		t.Fatal(err)
	}
	v := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: seq, Conflict: pb.Envelope_OVERWRITE, CoalesceKey: "price"}}
	if r, err := s.Enqueue(context.Background(), v); r != outbox.Replaced || err != nil {
		t.Fatalf("new version of a migrated OVERWRITE: %v %v, want Replaced", r, err)
	}
}


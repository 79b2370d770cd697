package outbox_test

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"slices"
	"testing"

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
	updateFile(tb, path, func(tx *bolt.Tx) error {
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

// A file of the first format opens: its queued messages come out of Head
// converted (TTL kept relative to when they were stored, the coalescing
// key moved to coalesce_key), the coalesce index still knows the newest
// versions, dead letters convert too, and the dedupe keys become the key
// window.
func TestMigrateFirstFormat(t *testing.T) {
	wall := epoch0.UnixMilli()
	const min = int64(60_000)
	base := uint64(epoch0.UnixNano()) // the first release numbered from the wall clock in ns
	queued := []v1Msg{
		{seq: base + 1, recipient: "a@n1", typ: "m1", idem: "idem-1", firstMs: wall - 10*min, expiresMs: wall + 50*min},
		{seq: base + 2, recipient: "a@n1", typ: "m2", idem: "price", overwrite: true, firstMs: wall - 5*min, attempts: 2},
		{seq: base + 3, recipient: "a@n1", typ: "m3", firstMs: wall - 120*min, expiresMs: wall - 60*min},
		{seq: base + 4, recipient: "b@n2", typ: "m4", firstMs: wall - 30*24*60*min}, // older than MaxAge
	}
	dead := []v1Msg{
		{seq: base + 5, recipient: "a@n1", typ: "d1", idem: "gone", overwrite: true, firstMs: wall - 60*min, reason: "rejected: x"},
		{seq: base + 6, recipient: "c@n3", typ: "d2", firstMs: wall - 60*min, reason: "max attempts"},
	}
	coalesce := map[string]uint64{
		"a@n1\x00price": base + 2,  // the waiting m2
		"a@n1\x00gone":  base + 10, // a newer version of d1, already delivered
	}
	dedupe := map[string]int64{
		"n2>actor\x00k-recent":   wall - 60*min,
		"n2>actor\x00k-old":      wall - 2*24*60*min,
		"n2>act>or\x00k-unclear": wall - 60*min, // cannot be split: dropped
		"n2>actor\x00auto:123":   wall - 60*min,
	}
	path := filepath.Join(t.TempDir(), "outbox.db")
	writeV1(t, path, queued, dead, coalesce, dedupe, base+100)

	e := &env{path: path, clk: outbox.NewManualClock(epoch0)}
	e.Store = mustOpen(t, config(path, e.clk, nil))
	t.Cleanup(func() { _ = e.Close() })
	now := e.ElapsedMs()

	// The expired m3 and the too-old m4 are sweeper candidates at once.
	cands, _, err := e.ExpiryCandidates(now, 10)
	if err != nil {
		t.Fatal(err)
	}
	var candSeqs []uint64
	for _, c := range cands {
		candSeqs = append(candSeqs, c.Seq)
	}
	slices.Sort(candSeqs)
	if !slices.Equal(candSeqs, []uint64{base + 3, base + 4}) {
		t.Fatalf("expiry candidates after migration %+v, want m3 (TTL) and m4 (age)", cands)
	}

	msgs, _, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := typesOf(msgs); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("a@n1 after migration: %v, want m1 m2 (m3 expired)", got)
	}
	m1, m2 := msgs[0], msgs[1]
	if m1.GetEnvelope().GetSequence() != base+1 || m2.GetEnvelope().GetSequence() != base+2 {
		t.Fatalf("sequences changed: %d %d", m1.GetEnvelope().GetSequence(), m2.GetEnvelope().GetSequence())
	}
	if got := m1.GetEnvelope().GetTtlMs(); got != 60*min {
		t.Fatalf("m1 ttl %d, want the whole hour it was given", got)
	}
	if left := m1.GetCreatedElapsedMs() + m1.GetEnvelope().GetTtlMs() - now; left != 50*min {
		t.Fatalf("m1 has %d ms left, want the 50 min it had", left)
	}
	if m1.GetEnvelope().GetIdempotencyKey() != "idem-1" || m1.GetEnvelope().GetCoalesceKey() != "" {
		t.Fatalf("m1 keys: idempotency %q coalesce %q", m1.GetEnvelope().GetIdempotencyKey(), m1.GetEnvelope().GetCoalesceKey())
	}
	if len(m1.GetEnvelope().ProtoReflect().GetUnknown()) != 0 || m1.GetEnvelope().GetProtocolVersion() != pb.ProtocolVersion {
		t.Fatalf("m1 envelope not converted: unknown %x, version %d", m1.GetEnvelope().ProtoReflect().GetUnknown(), m1.GetEnvelope().GetProtocolVersion())
	}
	if m1.GetFirstEnqueuedUnixMs() != wall-10*min {
		t.Fatalf("first enqueued %d", m1.GetFirstEnqueuedUnixMs())
	}
	if env := m2.GetEnvelope(); env.GetCoalesceKey() != "price" || env.GetIdempotencyKey() != "" ||
		env.GetConflict() != pb.Envelope_OVERWRITE || env.GetTtlMs() != 0 || m2.GetAttempts() != 2 {
		t.Fatalf("m2 not converted: %+v attempts %d", env, m2.GetAttempts())
	}
	if got := e.types(t, "b@n2"); len(got) != 0 {
		t.Fatalf("b@n2: %v, want m4 given up for age", got)
	}
	reasons := e.deadReasons(t)
	if !isExpired(reasons["m3"]) || reasons["m4"] != outbox.ReasonTooOld {
		t.Fatalf("dead letters %v", reasons)
	}

	// New sequences are above the old high-water; the coalesce index was
	// rebuilt around the waiting version.
	seq, err := e.ReserveSequence()
	if err != nil || seq <= base+100 {
		t.Fatalf("new sequence %d (%v), want above %d", seq, err, base+100)
	}
	v := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Type: "m2'", Sequence: seq, Conflict: pb.Envelope_OVERWRITE, CoalesceKey: "price"}}
	if r := e.put(t, v); r != outbox.Replaced {
		t.Fatalf("new version of a migrated OVERWRITE: %v, want Replaced", r)
	}

	// Dead letters are converted; one whose key has a newer version
	// (already delivered before the upgrade) is not replayed.
	dl, err := e.DeadLetters(outbox.DLQFilter{Reason: "rejected"})
	if err != nil || len(dl) != 1 || dl[0].Message.GetEnvelope().GetCoalesceKey() != "gone" {
		t.Fatalf("migrated dead letter %+v %v", dl, err)
	}
	if n, err := e.Replay(outbox.DLQFilter{Reason: "rejected"}); n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replay of a dead letter superseded before the upgrade: %d %v", n, err)
	}
	if n, err := e.Replay(outbox.DLQFilter{Recipient: "c@n3"}); n != 1 || err != nil {
		t.Fatalf("replay of a migrated dead letter: %d %v", n, err)
	}

	// The dedupe window became the key window.
	for key, want := range map[string]bool{"k-recent": true, "auto:123": true, "k-old": false} {
		if seen, err := e.KeySeen(outbox.ScopedKey("n2", "actor", key)); seen != want || err != nil {
			t.Fatalf("key %s seen %v (%v), want %v", key, seen, err, want)
		}
	}
	if st, _ := outbox.BucketStats(e.Store, "dedupe"); st.KeyN != 0 {
		t.Fatalf("old dedupe bucket left with %d keys", st.KeyN)
	}
	// Migrated keys age out of the window and off the disk like new ones,
	// also behind a key recorded after the upgrade.
	e.clk.Advance(e.Config().KeyWindow / 2)
	fresh := outbox.ScopedKey("n2", "actor", "fresh")
	if err := commitStream(t, e.Store, &outbox.StreamCommit{Stream: []byte("s"), Watermark: 1, Keys: [][]byte{fresh}}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(e.Config().KeyWindow / 2)
	for range 3 {
		sync_(t, e.Store)
	}
	if k, a := keysOnDisk(t, e.Store); k != 1 || a != 1 {
		t.Fatalf("migrated keys not pruned after the window: %d keys, %d age entries, want only the fresh one", k, a)
	}

	id := e.OutboxID()
	if id == [16]byte{} {
		t.Fatal("no outbox id after migration")
	}
	// Opened again, it is not migrated again.
	e.reopen(t, nil)
	if got := e.types(t, "a@n1"); !slices.Equal(got, []string{"m2'"}) { // m1's TTL ran out meanwhile
		t.Fatalf("after reopen %v", got)
	}
	if e.OutboxID() != id {
		t.Fatal("outbox id changed on the second open")
	}
}

func isExpired(reason string) bool {
	return reason == outbox.ReasonExpired || reason == outbox.ReasonExpiredUnknown
}

// A file written by a newer meshnode is refused, and left as it was.
func TestNewerFormatRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		m, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		return m.Put([]byte("format"), be(99))
	})
	_ = db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s, err := outbox.Open(config(path, outbox.NewManualClock(epoch0), nil)); !errors.Is(err, outbox.ErrFormat) {
		if err == nil {
			_ = s.Close()
		}
		t.Fatalf("open of format 99: %v, want ErrFormat", err)
	}
}

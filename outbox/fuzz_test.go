package outbox

import (
	"bytes"
	"encoding/binary"
	"github.com/meshnode/meshnode/internal/address"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// FuzzDecodeRecord: queue records on disk may be corrupt (a torn file, a
// bug of another version); decoding must return an error, never panic,
// and the header readers must agree with what encodeRecord wrote.
func FuzzDecodeRecord(f *testing.F) {
	good, _ := encodeRecord(&pb.StoredMessage{
		Envelope:         &pb.Envelope{Recipient: "a@n1", Sequence: 7, TtlMs: 1000, CoalesceKey: "k", Conflict: pb.Envelope_OVERWRITE},
		Attempts:         2,
		CreatedElapsedMs: 99,
	}, 1099, flagCoalesce)
	f.Add(good)
	f.Add([]byte{})
	f.Add(make([]byte, recFixed))
	f.Add(append(make([]byte, recFixed), 0x0a, 0xff, 0xff))
	f.Add(append(recordHeader(5, 0, 0, "a@n1", 0), 0x0a, 0xff, 0xff))
	f.Add([]byte{0: 1, 17: 0xff, 18: 0xff, 30: 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		created, giveUp, flags := createdMs(b), deadlineMs(b), recFlags(b)
		sm, err := decodeRecord(b)
		if err != nil {
			return
		}
		if sm.GetEnvelope() == nil {
			t.Fatal("decoded record without envelope")
		}
		if created != int64(binary.BigEndian.Uint64(b[:8])) || giveUp != int64(binary.BigEndian.Uint64(b[8:16])) || flags != b[16] {
			t.Fatal("header readers disagree with the header")
		}
		re, err := encodeRecord(sm, giveUp, flags)
		if len(sm.GetEnvelope().GetRecipient()) > maxRecipientLen {
			if err == nil {
				t.Fatal("encoded a recipient longer than its limit")
			}
			return
		}
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if string(recRecipient(re)) != sm.GetEnvelope().GetRecipient() {
			t.Fatalf("header names %q, the envelope %q", recRecipient(re), sm.GetEnvelope().GetRecipient())
		}
		sm2, err := decodeRecord(re)
		if err != nil || !proto.Equal(sm, sm2) {
			t.Fatalf("round trip: %v", err)
		}
		if deadlineMs(re) != giveUp || recFlags(re) != flags || createdMs(re) != sm.GetCreatedElapsedMs() {
			t.Fatal("header not written back")
		}
	})
}

// FuzzDecodeOutStream: a stream record never panics its reader.
func FuzzDecodeOutStream(f *testing.F) {
	good, _ := proto.Marshal(&pb.OutStream{Epoch: 5, HighWater: 9, SendAtElapsedMs: 100})
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0x08})
	f.Fuzz(func(t *testing.T, b []byte) {
		os, err := decodeOutStream(b)
		if os == nil {
			t.Fatal("nil stream record")
		}
		if err == nil && len(b) == 0 && (os.GetEpoch() != 0 || os.GetHighWater() != 0) {
			t.Fatal("empty record with state")
		}
	})
}

// FuzzResume: the persisted elapsed-clock checkpoint and its boot record
// may be anything; the clock resumes without panicking. For a sane
// checkpoint it counts the downtime exactly when the boot record is of the
// clock's boot and not ahead of its uptime, else within [0, MaxDowntime].
func FuzzResume(f *testing.F) {
	cp := func(last, wall int64) []byte {
		return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(last)), uint64(wall))
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Add(cp(1000, now.UnixMilli()-5000), int64(time.Hour), []byte(nil), false, int64(0))
	f.Add(cp(0, now.UnixMilli()+5000), int64(time.Hour), binary.BigEndian.AppendUint64(nil, 500), true, int64(time.Minute))
	f.Add(cp(7, now.UnixMilli()-int64(48*time.Hour/time.Millisecond)), int64(time.Hour), binary.BigEndian.AppendUint64(nil, 1<<62), true, int64(time.Second))
	f.Add([]byte{1, 2, 3}, int64(0), []byte{9}, true, int64(0))
	f.Fuzz(func(t *testing.T, checkpoint []byte, maxDown int64, boot []byte, sameBoot bool, uptime int64) {
		if maxDown < 0 {
			maxDown = -maxDown
		}
		uptime = max(0, uptime%int64(100*365*24*time.Hour))
		clk := NewManualClock(now)
		clk.Advance(time.Duration(uptime))
		clk.Step(-time.Duration(uptime)) // the wall clock reads now
		id, _, _ := clk.Boot()
		if sameBoot && len(boot) >= 8 {
			boot = append(append(boot[:8:8], checkpoint...), id...)
		}
		e, _, exact := resume(clk, checkpoint, boot, time.Duration(maxDown))
		if len(checkpoint) != 16 {
			if e.nowMs() != 0 || exact {
				t.Fatalf("no checkpoint: elapsed %d, exact %v", e.nowMs(), exact)
			}
			return
		}
		last := int64(binary.BigEndian.Uint64(checkpoint[:8]))
		if last < 0 || last > 1<<50 {
			return // not a checkpoint this code writes
		}
		added := e.nowMs() - last
		then := int64(-1)
		if sameBoot && len(boot) >= 8 {
			then = int64(binary.BigEndian.Uint64(boot[:8]))
		}
		upMs := time.Duration(uptime).Milliseconds()
		switch {
		case then >= 0 && then <= upMs:
			if !exact || added != upMs-then {
				t.Fatalf("same boot, uptime %d ms then %d now: added %d ms (exact %v), want %d", then, upMs, added, exact, upMs-then)
			}
		case exact:
			t.Fatalf("boot record %x counted as exact (uptime %d ms)", boot, upMs)
		case added < 0 || added > time.Duration(maxDown).Milliseconds():
			t.Fatalf("restart added %d ms, want within [0, %d]", added, time.Duration(maxDown).Milliseconds())
		}
	})
}

// FuzzMigrateEnvelope: a first-format envelope's unknown fields (where
// expires_at_unix_ms now lives) are read without panicking, and none
// survive the conversion.
func FuzzMigrateEnvelope(f *testing.F) {
	var old []byte
	old = protowire.AppendTag(old, 7, protowire.VarintType)
	old = protowire.AppendVarint(old, 1_900_000_000_000)
	f.Add(old, int64(1_899_999_000_000))
	f.Add([]byte{0x38}, int64(0))
	f.Add([]byte{0x3a, 0x05, 1}, int64(5))
	f.Fuzz(func(t *testing.T, unknown []byte, first int64) {
		env := &pb.Envelope{Recipient: "a@n1", Conflict: pb.Envelope_OVERWRITE, IdempotencyKey: "k"}
		env.ProtoReflect().SetUnknown(unknown)
		sm := &pb.StoredMessage{Envelope: env, FirstEnqueuedUnixMs: first}
		migrateEnvelope(sm)
		if len(sm.GetEnvelope().ProtoReflect().GetUnknown()) != 0 {
			t.Fatal("unknown fields survive")
		}
		if sm.GetEnvelope().GetTtlMs() < 0 {
			t.Fatalf("negative TTL %d", sm.GetEnvelope().GetTtlMs())
		}
		if sm.GetEnvelope().GetCoalesceKey() != "k" || sm.GetEnvelope().GetIdempotencyKey() != "" {
			t.Fatal("coalescing key not moved")
		}
	})
}

func FuzzCheckRecipient(f *testing.F) {
	for _, s := range []string{"a@n1", "", "@", "a@", "@n", "a@b@c", "\x00@n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, r string) {
		if checkRecipient(r) != nil {
			return
		}
		if address.Node(r) == "" || bytes.IndexByte([]byte(r), 0) >= 0 || len(r) > maxRecipientLen {
			t.Fatalf("accepted %q", r)
		}
	})
}

// FuzzStreamKey: two different streams never share a key.
func FuzzStreamKey(f *testing.F) {
	f.Add("a>b", "c", uint64(1), "a", "b>c", uint64(1))
	f.Add("a\x00", "b", uint64(0), "a", "\x00b", uint64(0))
	f.Fuzz(func(t *testing.T, n1, a1 string, e1 uint64, n2, a2 string, e2 uint64) {
		k1 := StreamKey(n1, [16]byte{}, e1, a1)
		k2 := StreamKey(n2, [16]byte{}, e2, a2)
		if bytes.Equal(k1, k2) != (n1 == n2 && a1 == a2 && e1 == e2) {
			t.Fatalf("(%q %d %q) and (%q %d %q): keys equal %v", n1, e1, a1, n2, e2, a2, bytes.Equal(k1, k2))
		}
		s1, s2 := ScopedKey(n1, a1, "k"), ScopedKey(n2, a2, "k")
		if bytes.Equal(s1, s2) != (n1 == n2 && a1 == a2) {
			t.Fatalf("scopes (%q %q) and (%q %q): keys equal %v", n1, a1, n2, a2, bytes.Equal(s1, s2))
		}
	})
}

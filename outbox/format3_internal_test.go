package outbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// format2Epoch is the manual clock testdata/format2 was written with.
var format2Epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// copyFormat2 copies testdata/format2's file and its companions into a new
// directory and returns the file's path there.
func copyFormat2(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	for _, name := range []string{"format2.db", "format2.db.id", "format2.db.seq", "format2.db.clean"} {
		b, err := os.ReadFile(filepath.Join("testdata", "format2", name))
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return filepath.Join(dir, "format2.db")
}

// format2Want returns what Head returned from testdata/format2 before the
// upgrade, by recipient, in order.
func format2Want(tb testing.TB) map[string][]*pb.StoredMessage {
	tb.Helper()
	f, err := os.Open(filepath.Join("testdata", "format2", "format2.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	want := map[string][]*pb.StoredMessage{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sm := &pb.StoredMessage{}
		if err := protojson.Unmarshal(sc.Bytes(), sm); err != nil {
			tb.Fatal(err)
		}
		r := sm.GetEnvelope().GetRecipient()
		want[r] = append(want[r], sm)
	}
	return want
}

func format2Config(path string, maxBatch int) Config {
	cfg := DefaultConfig(path)
	cfg.Clock = NewManualClock(format2Epoch.Add(time.Minute))
	if maxBatch > 0 {
		cfg.MaxBatch = maxBatch
	}
	return cfg
}

// checkFormat2 checks that s holds what testdata/format2 held: every queue
// in order, byte for byte as Head returned it before, the dead letter, the
// epoch and the coalesce index.
func checkFormat2(t *testing.T, s *Store) {
	t.Helper()
	want := format2Want(t)
	total := 0
	for r, msgs := range want {
		got, _, err := s.Head(HeadRequest{Recipient: r, Max: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(msgs) {
			t.Fatalf("%s: %d messages, want %d", r, len(got), len(msgs))
		}
		for i := range msgs {
			if !proto.Equal(got[i], msgs[i]) {
				t.Errorf("%s message %d:\n got %v\nwant %v", r, i, got[i], msgs[i])
			}
		}
		total += len(msgs)
	}
	if st := s.Stats(); st.Depth != total || st.DLQDepth != 1 {
		t.Errorf("depth %d, dead letters %d; want %d, 1", st.Depth, st.DLQDepth, total)
	}
	if epoch, _, err := s.StreamState("a@n1"); err != nil || epoch != 7 {
		t.Errorf("a@n1's epoch %d (%v), want 7", epoch, err)
	}
	// The waiting version of c@n2's "price" is still the one a newer
	// version replaces.
	seq, err := s.ReserveSequence()
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Enqueue(context.Background(), &pb.StoredMessage{Envelope: &pb.Envelope{
		Recipient: "c@n2", Sender: "app@n0", Sequence: seq, Type: "c3", Conflict: pb.Envelope_OVERWRITE, CoalesceKey: "price"}})
	if err != nil || res != Replaced {
		t.Errorf("a newer version of c@n2's price: %v, %v; want replaced", res, err)
	}
}

// A file of format 2 (a bucket per queue) opens with every message where
// it was, in order, its indexes working; also when the move takes many
// transactions. The file is format 3 afterwards, its old queues gone.
func TestFormat2FileUpgrades(t *testing.T) {
	for _, maxBatch := range []int{0, 2} {
		t.Run(fmt.Sprintf("max_batch=%d", maxBatch), func(t *testing.T) {
			path := copyFormat2(t)
			s, err := Open(format2Config(path, maxBatch))
			if err != nil {
				t.Fatal(err)
			}
			checkFormat2(t, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			format, queues := fileFormat(t, path)
			if format != 3 || queues {
				t.Fatalf("after the upgrade: format %d, old queues left %v", format, queues)
			}
			// And again, from the new layout.
			s, err = Open(format2Config(path, maxBatch))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.Stats().Depth; got != 13 {
				t.Fatalf("after a reopen: depth %d, want 13", got)
			}
		})
	}
}

// fileFormat reads the format key of the file at path, and whether format
// 2's queue bucket is still in it.
func fileFormat(tb testing.TB, path string) (uint64, bool) {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	var format uint64
	var queues bool
	err = db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(keyFormat); len(v) == 8 {
			format = binary.BigEndian.Uint64(v)
		}
		queues = tx.Bucket(bucketQueues) != nil
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return format, queues
}

// A crash in the middle of the upgrade leaves some records moved and the
// rest in their old queues, the file already format 3: the next Open goes
// on, and every queue is whole and in order.
func TestFormat2UpgradeInterruptedGoesOn(t *testing.T) {
	path := copyFormat2(t)
	// What the first transaction of the upgrade would have done with
	// MaxBatch 4, written here by hand: a@n1's first four records moved.
	editFile(t, path, func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketMeta).Put(keyFormat, u64(3)); err != nil {
			return err
		}
		recs, err := tx.CreateBucket(bucketRecords)
		if err != nil {
			return err
		}
		old := tx.Bucket(bucketQueues).Bucket([]byte("a@n1"))
		var keys [][]byte
		c := old.Cursor()
		for k, v := c.First(); k != nil && len(keys) < 4; k, v = c.Next() {
			val := append(recordHeader(createdMs(v), deadlineMs(v), v[16], "a@n1", 0), v[17:]...)
			if err := recs.Put(k, val); err != nil {
				return err
			}
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := old.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	s, err := Open(format2Config(path, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkFormat2(t, s)
}

// Two queues of a format 2 file holding the same sequence (no meshnode
// wrote that; a damaged or hand-edited file): the second record cannot
// share the first's key, and goes to the dead-letter queue, named, rather
// than being lost or failing the upgrade.
func TestFormat2DuplicateSequenceIsDeadLettered(t *testing.T) {
	path := copyFormat2(t)
	editFile(t, path, func(tx *bolt.Tx) error {
		q := tx.Bucket(bucketQueues)
		k, v := q.Bucket([]byte("a@n1")).Cursor().First()
		z, err := q.CreateBucket([]byte("z@n9")) // after a@n1 in the upgrade's order
		if err != nil {
			return err
		}
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "z@n9", Sequence: seqOf(k), Type: "twin"}}
		b, err := proto.Marshal(sm)
		if err != nil {
			return err
		}
		return z.Put(k, append(bytes.Clone(v[:17]), b...))
	})
	s, err := Open(format2Config(path, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dead, err := s.DeadLetters(DLQFilter{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range dead {
		if d.Message.GetEnvelope().GetType() == "twin" && strings.Contains(d.Reason, "also queued for a@n1") {
			found = true
		}
	}
	if !found {
		t.Fatalf("the twin record is not in the dead-letter queue: %v", dead)
	}
	checkFormat2Queues(t, s)
}

// checkFormat2Queues checks the queues of testdata/format2 alone.
func checkFormat2Queues(t *testing.T, s *Store) {
	t.Helper()
	for r, msgs := range format2Want(t) {
		got, _, err := s.Head(HeadRequest{Recipient: r, Max: 100})
		if err != nil || len(got) != len(msgs) {
			t.Fatalf("%s: %d messages (%v), want %d", r, len(got), err, len(msgs))
		}
	}
}

// A record whose header names no queue (a damaged file) is moved to the
// dead-letter queue at Open; the rest of the file opens as it was.
func TestRecordNamingNoQueueIsSetAside(t *testing.T) {
	path := copyFormat2(t)
	s, err := Open(format2Config(path, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	editFile(t, path, func(tx *bolt.Tx) error {
		recs := tx.Bucket(bucketRecords)
		// A header claiming a recipient longer than the record, and one
		// naming something that is not an address.
		if err := recs.Put(u64(1<<40), []byte{0: 1, 17: 0xff, 18: 0xff, 20: 0}); err != nil {
			return err
		}
		return recs.Put(u64(1<<40+1), recordHeader(1, 0, 0, "no address", 0))
	})
	s, err = Open(format2Config(path, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st := s.Stats(); st.DLQDepth != 3 {
		t.Fatalf("dead letters %d, want 3 (the file's one and the two damaged records)", st.DLQDepth)
	}
	checkFormat2Queues(t, s)
	seq, err := s.ReserveSequence()
	if err != nil || seq <= 1<<40+1 {
		t.Fatalf("next sequence %d (%v): must be above the damaged records' %d", seq, err, uint64(1<<40+1))
	}
}

// editFile changes the (closed) file at path in one bbolt transaction.
func editFile(tb testing.TB, path string, edit func(tx *bolt.Tx) error) {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := db.Update(edit); err != nil {
		tb.Fatal(err)
	}
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
}

// A record above MaxSequence in the file (a damaged file: Enqueue refuses
// such sequences) is set aside at Open, and the sequences handed out
// after it go on from the highest one below: the high-water never wraps
// to 0 and hands out old sequences again.
func TestRecordAboveMaxSequenceIsSetAside(t *testing.T) {
	path := copyFormat2(t)
	s, err := Open(format2Config(path, 0))
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.ReserveSequence()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	editFile(t, path, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).Put(u64(math.MaxUint64), recordHeader(1, 0, 0, "a@n1", 0))
	})
	if s, err = Open(format2Config(path, 0)); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st := s.Stats(); st.DLQDepth != 2 {
		t.Fatalf("dead letters %d, want 2 (the file's one and the record above MaxSequence)", st.DLQDepth)
	}
	checkFormat2Queues(t, s)
	if seq, err := s.ReserveSequence(); err != nil || seq <= before || seq > MaxSequence {
		t.Fatalf("next sequence %d (%v): want above %d, handed out before", seq, err, before)
	}
}

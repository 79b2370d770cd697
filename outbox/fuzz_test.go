package outbox

import (
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// FuzzDecodeQueued: records on disk may be corrupt (torn file, another
// version); decoding must return an error, never panic.
func FuzzDecodeQueued(f *testing.F) {
	good, _ := encodeQueued(&pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sequence: 7}, Attempts: 2, FirstEnqueuedUnixMs: 99})
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		sm, err := decodeQueued(b)
		if err != nil {
			return
		}
		if sm.GetEnvelope() == nil {
			t.Fatal("decoded record without envelope")
		}
		if enqueuedMs(b) != int64(uint64(b[0])<<56|uint64(b[1])<<48|uint64(b[2])<<40|uint64(b[3])<<32|uint64(b[4])<<24|uint64(b[5])<<16|uint64(b[6])<<8|uint64(b[7])) {
			t.Fatal("enqueued prefix mismatch")
		}
	})
}

func FuzzCheckRecipient(f *testing.F) {
	for _, s := range []string{"a@n1", "", "@", "a@", "@n", "a@b@c", "\x00@n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, r string) {
		if checkRecipient(r) == nil && nodeOf(r) == "" {
			t.Fatalf("accepted %q without a node", r)
		}
	})
}

package partition

import (
	"math"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// A receipt's room is a uint32 (node/actor.go clamps it to
// MaxUint32 "because an int has 32 bits on some platforms"), and roomIn
// reads it as int(rc.GetRoom()): on a 32-bit sender a room of 2^31 or
// more (a 64-bit receiver whose MailboxCapacity and PeerQueuedBytes are
// both unbounded says 2^32-1) is negative. The sender then sends nothing
// early to the receiver that said it has the most room (earlySize 0,
// where room 100 gives a full batch), and heard records "said nothing"
// (room 2^32-1 → -1 → stored 0) or, for room 2^31, a bound of one
// message per emission (stored 1). Such a room is now the most an int
// holds (a 32-bit platform's test).
func TestRoomPastAnIntIsTheMostOne(t *testing.T) {
	r := &Relay{cfg: Config{BatchSize: 64}}
	next := &emission{}
	for _, room := range []uint32{100, 1 << 31, math.MaxUint32} {
		rc := &pb.Receipt{Room: room, Arrived: 1}
		if got := r.earlySize(rc, 0, next, 0); got != 64 {
			t.Errorf("receipt saying room %d: earlySize %d, want a full batch (64)", room, got)
		}
		st := &stream{}
		r.heard(st, rc)
		if want := uint16(min(uint64(room), math.MaxUint16-1) + 1); st.room != want {
			t.Errorf("receipt saying room %d: stream room %d, want %d", room, st.room, want)
		}
	}
}

package node

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// evictions counts, per stream, the reliable messages a DropOldest mailbox
// evicted whose drop has not been answered yet (actor.dropped compares a
// dropped message with its stream's watermark and may mark the stream
// divergent). The mailbox lets go of an evicted message before its drop is
// answered, and the actor may meanwhile take the message behind it: a
// restored sender's message chained to the watermark's sequence would then
// run in the old epoch before the dropped one was found to be another
// message there. So an actor that takes a message of a stream with a drop
// still unanswered refuses it for room (refuseWhileEvicting); its sender sends
// it again a moment later. Counted under the mailbox's lock (OnEvict),
// before anything behind the evicted message can be taken.
type evictions struct {
	n  atomic.Int64 // all streams: while it is 0, pending reads nothing else
	mu sync.Mutex
	by map[StreamID]int
}

// evicted counts one evicted message of stream id.
func (e *evictions) evicted(id StreamID) {
	e.mu.Lock()
	if e.by == nil {
		e.by = make(map[StreamID]int)
	}
	e.by[id]++
	e.n.Add(1)
	e.mu.Unlock()
}

// answered counts one of stream id's evicted messages as answered.
func (e *evictions) answered(id StreamID) {
	e.mu.Lock()
	if e.by[id] > 1 {
		e.by[id]--
	} else {
		delete(e.by, id)
	}
	e.n.Add(-1)
	e.mu.Unlock()
}

// pending reports whether a message of stream id was evicted and its drop
// is not answered yet.
func (e *evictions) pending(id StreamID) bool {
	if e.n.Load() == 0 {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.by[id] > 0
}

// evictionRetry is the retry hint of a message refused while an earlier
// message of its stream is being dropped: the drop is answered within
// microseconds.
const evictionRetry = 10 * time.Millisecond

// refuseWhileEvicting answers d, a message of a stream whose evicted
// message's drop is not answered yet (evictions), taken by its actor: as
// a refusal for room (refuseForRoom), which compares it with the message
// at the watermark, or keeps it to compare with the one that later runs
// under its sequence, as any refusal before the owner decided does. Its
// answer goes through rc.
func (a *actor) refuseWhileEvicting(d *delivery, rc func(*pb.Receipt)) {
	a.expectBack(d, evictionRetry) // as for any refusal for room
	a.n.refuseForRoom(d.stream, a.applied(), d.env, rc, "not run: an earlier message of its stream was just dropped for room", evictionRetry)
}

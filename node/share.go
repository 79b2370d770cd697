package node

import "sync/atomic"

// Sharing a mailbox's room. A receipt tells the sender how many more of
// its messages the mailbox could take, and the sender sends that many
// ahead of its receipts. Told the whole room, two senders draining into
// one actor (a thundering herd after a partition heals) would each fill
// it, and the later arrivals be refused. So the room a receipt says is
// divided among the streams that contend for the mailbox: those that had
// more than one message in it at once, or were refused for room, within
// the current or the previous window of contendWindowMs. A stream that
// sends one message at a time does not contend and takes nothing from the
// others' share. What a receipt says is advice to the sender: a wrong
// count costs throughput (too small a share) or refusals (too large), never
// a message.

// contendWindowMs is the length of a window, in ms of the store's clock:
// a stream counts for one to two windows after it last contended, long
// enough to cover a refused sender's wait before it sends again.
const contendWindowMs = 250

// contenders counts the streams that contended for an actor's mailbox in
// the current and the previous window, packed in 32 bits so that the
// actor stays small: the window number's low 16 bits, the current
// window's count, the previous window's (8 bits each, saturating).
type contenders struct{ v atomic.Uint32 }

func packContenders(window uint32, cur, prev uint32) uint32 {
	return window&0xffff<<16 | min(cur, 0xff)<<8 | min(prev, 0xff)
}

// add counts one more stream contending in window w.
func (c *contenders) add(w uint32) {
	for {
		old := c.v.Load()
		cur, prev := old>>8&0xff, old&0xff
		var next uint32
		switch old >> 16 {
		case w & 0xffff:
			next = packContenders(w, cur+1, prev)
		case (w - 1) & 0xffff:
			next = packContenders(w, 1, cur)
		default:
			next = packContenders(w, 1, 0)
		}
		if c.v.CompareAndSwap(old, next) {
			return
		}
	}
}

// count is how many streams contended in window w or the one before (the
// larger of the two windows' counts).
func (c *contenders) count(w uint32) int {
	v := c.v.Load()
	cur, prev := int(v>>8&0xff), int(v&0xff)
	switch v >> 16 {
	case w & 0xffff:
		return max(cur, prev)
	case (w - 1) & 0xffff:
		return cur
	}
	return 0
}

// window is the number of the current window. It starts at 2: a stream's
// contended is 0 until it contends, which must read as neither the
// current window nor the one before.
func (a *actor) window() uint32 {
	return uint32(a.n.store.ElapsedMs()/contendWindowMs) + 2
}

// contend records that st contends for a's mailbox in window w.
func (a *actor) contend(st *inStream, w uint32) {
	if st.contended.Load() != w && st.contended.Swap(w) != w {
		a.contenders.add(w)
	}
}

// sharing returns how many streams share the room said to st now: those
// that contended lately, st among them; refused says st was just refused
// for room, which is contending too.
func (a *actor) sharing(st *inStream, refused bool) int {
	w := a.window()
	if refused {
		a.contend(st, w)
	}
	n := a.contenders.count(w)
	if last := st.contended.Load(); last != w && last != w-1 {
		n++ // st shares the room too
	}
	return max(n, 1)
}

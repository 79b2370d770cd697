package partition

import "github.com/meshnode/meshnode/internal/address"

// Finding what to send.
//
// Each loop asks the store for its due recipients (DueRecipients) and
// skips those it cannot start an emission for: another partition's, a
// stream already sending (blocked), a node at its AIMD limit. Skipping is
// cheap per recipient but was paid on every wake-up for every due
// recipient of every full node: with a thousand peers at their limit and
// ten recipients each, ten thousand steps to find the few that can go.
//
// So a full node is excluded as a whole: the store keeps its queues out
// of the scan (outbox.Store.ExcludeNode) until a release of its slots
// makes room (IncludeNode). The check of the limiter and the store's
// exclusion are one step under xmu, and every release is followed by an
// include check, so a node is never left excluded with free slots: it is
// excluded only while it holds slots (Limit >= 1), and the release of the
// last of them includes it. A limit lowered by a capacity receipt can make
// a node full without an acquire; the scan's filter still sees it and
// excludes it after the scan (the filter itself runs under the store's
// lock and must not call back into it).

// scan returns p's due recipients and when to look next, excluding the
// nodes it finds full.
func (r *Relay) scan(p *part, now int64) (due []string, next int64) {
	var full []string
	keep := func(rcpt string) bool {
		if PartitionOf(rcpt, len(r.parts)) != p.id {
			return false
		}
		if st := p.lookup(rcpt); st != nil && st.blocked.Load() {
			return false
		}
		// A node at its AIMD limit is skipped until an emission to it
		// completes and wakes the loop; this is what keeps a full peer
		// from turning the loop into a spin.
		node := address.Node(rcpt)
		l := r.Limiter(node)
		if l.InFlight() < l.Limit() {
			return true
		}
		if len(full) == 0 || full[len(full)-1] != node {
			full = append(full, node)
		}
		return false
	}
	due, next = r.store.DueRecipients(now, keep, r.cfg.MaxDue)
	for _, node := range full {
		r.exclude(node, r.Limiter(node))
	}
	return due, next
}

// exclude takes node out of the scans while l, its limiter, is full.
func (r *Relay) exclude(node string, l *Limiter) {
	r.xmu.Lock()
	defer r.xmu.Unlock()
	if l.InFlight() >= l.Limit() {
		r.store.ExcludeNode(node)
	}
}

// release returns n of node's slots to l and, if that made room, brings
// the node back into the scans. It wakes every loop when the node had been
// left out of them or was full before this release: a loop that found the
// node full (in its scan, or at dispatch when a direct attempt took the
// last slot) gave up on its recipients without a timer, and they may be
// in any partition.
func (r *Relay) release(node string, l *Limiter, n int) {
	r.xmu.Lock()
	wasFull := l.InFlight() >= l.Limit()
	l.Release(n)
	included := l.InFlight() < l.Limit() && r.store.IncludeNode(node)
	r.xmu.Unlock()
	if wasFull || included {
		r.wakeAll()
	}
}

package outbox

import "github.com/google/btree"

// The due index: which queues are due, by node.
//
// The relay paces each peer node with an AIMD limit and asks, on every
// wake-up, for the due recipients of the nodes that have room. With one
// btree of every queue, a scan walked each due queue of each node at its
// limit just to skip it: with a thousand peers full and ten recipients
// each, ten thousand steps per wake-up, however little there was to send.
//
// So the index has two levels. Each node keeps its own btree of queues by
// send_at; Store.nodes orders the nodes by the send_at of their earliest
// queue (their head). A node the relay excluded (ExcludeNode: it is at its
// limit) is held out of Store.nodes, so a scan never reaches it: excluding
// and including it again is one O(log nodes) step, whatever its queue
// count. DueRecipients merges the included nodes' queues in (send_at,
// name) order, as the single btree did, taking a node from Store.nodes
// only when its head comes next; a scan therefore costs O(log n) per queue
// it visits, and it visits the due queues of included nodes only.

// nodeQueues is one node's non-empty queues.
type nodeQueues struct {
	name   string
	queues map[string]*queue     // by recipient
	due    *btree.BTreeG[*queue] // the same queues, by (sendAt, name)
	head   *queue                // due's first: the node's key in Store.nodes
	held   bool                  // excluded: not in Store.nodes
}

func lessNode(a, b *nodeQueues) bool { return lessQueue(a.head, b.head) }

// nodeDegree is the degree of each node's btree: most nodes have a few
// queues, so a small one keeps their memory small.
const nodeDegree = 8

// unlink takes n out of s.nodes before its head's key changes. Caller
// holds mu.
func (s *Store) unlink(n *nodeQueues) {
	if !n.held && n.head != nil {
		s.nodes.Delete(n)
	}
}

// link puts n back in s.nodes under its current head. Caller holds mu.
func (s *Store) link(n *nodeQueues) {
	n.head, _ = n.due.Min()
	if !n.held && n.head != nil {
		s.nodes.ReplaceOrInsert(n)
	}
}

// insertQueue adds a new non-empty recipient to every index. Caller holds mu.
func (s *Store) insertQueue(st *queue) {
	s.queues[st.name] = st
	n := s.byNode[st.node]
	if n == nil {
		_, held := s.excluded[st.node]
		n = &nodeQueues{name: st.node, queues: make(map[string]*queue), due: btree.NewG(nodeDegree, lessQueue), held: held}
		s.byNode[st.node] = n
	}
	s.unlink(n)
	n.queues[st.name] = st
	n.due.ReplaceOrInsert(st)
	s.link(n)
	s.depth += st.count()
}

// removeQueue drops an emptied recipient from every index. Caller holds mu.
func (s *Store) removeQueue(st *queue) {
	delete(s.queues, st.name)
	n := s.byNode[st.node]
	if n == nil {
		return
	}
	s.unlink(n)
	delete(n.queues, st.name)
	n.due.Delete(st)
	if len(n.queues) == 0 {
		delete(s.byNode, st.node)
		return
	}
	s.link(n)
}

// setSendAt moves st in the due index. Caller holds mu.
func (s *Store) setSendAt(st *queue, at int64) {
	if st.sendAt == at {
		return
	}
	n := s.byNode[st.node]
	// The node's key changes only if st is its head or becomes it.
	moves := st == n.head || at < n.head.sendAt || (at == n.head.sendAt && st.name < n.head.name)
	if moves {
		s.unlink(n)
	}
	n.due.Delete(st)
	st.sendAt = at
	n.due.ReplaceOrInsert(st)
	if moves {
		s.link(n)
	}
}

// ExcludeNode holds node's queues out of DueRecipients until IncludeNode:
// the relay has no room to send to it (its AIMD limit is full), so its
// queues need not be walked. It is O(log nodes) and holds for queues
// stored meanwhile. Excluding an excluded node does nothing.
func (s *Store) ExcludeNode(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.excluded[node]; ok {
		return
	}
	s.excluded[node] = struct{}{}
	if n := s.byNode[node]; n != nil {
		s.unlink(n)
		n.held = true
	}
}

// IncludeNode ends ExcludeNode: node's due queues are returned by
// DueRecipients again. It reports whether node was excluded. Including a
// node not excluded does nothing and takes only the read lock, so the
// relay may call it after every emission.
func (s *Store) IncludeNode(node string) bool {
	s.mu.RLock()
	_, ok := s.excluded[node]
	s.mu.RUnlock()
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.excluded[node]; !ok {
		return false
	}
	delete(s.excluded, node)
	if n := s.byNode[node]; n != nil && n.held {
		n.held = false
		s.link(n)
	}
	return true
}

// ExcludedNodes returns how many nodes are excluded now (for tests and
// stats).
func (s *Store) ExcludedNodes() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.excluded)
}

// DueRecipients returns up to limit recipients whose queue is non-empty,
// whose send_at <= nowMs (elapsed), whose node is not excluded
// (ExcludeNode) and for which keep returns true, in (send_at, recipient)
// order. keep is called with the store's lock held and must not call back
// into the Store. next is the earliest send_at among the kept recipients
// of included nodes that are not yet due (0 if none), or nowMs when more
// were due than limit. The cost is O(log n) per queue visited, and only
// included nodes' queues are visited: never a scan of the file, nor of the
// nodes excluded.
func (s *Store) DueRecipients(nowMs int64, keep func(recipient string) bool, limit int) (due []string, next int64) {
	if limit <= 0 {
		limit = 1
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	// A k-way merge of the included nodes' btrees. Nodes are taken from
	// s.nodes (ordered by head) only when their head comes before every
	// cursor in h, so a scan that ends early leaves the rest untouched.
	var h cursors
	pending, _ := s.nodes.Min()
	for {
		for pending != nil && (len(h) == 0 || lessQueue(pending.head, h[0].q)) {
			h.push(cursor{n: pending, q: pending.head})
			pending = after(s.nodes, pending)
		}
		if len(h) == 0 {
			return due, next
		}
		st := h[0].q
		if st.sendAt > nowMs {
			if keep == nil || keep(st.name) {
				return due, st.sendAt
			}
		} else if keep == nil || keep(st.name) {
			if len(due) == limit {
				return due, nowMs // full: more are due now
			}
			due = append(due, st.name)
		}
		if q := after(h[0].n.due, st); q != nil {
			h[0].q = q
		} else {
			h[0] = h[len(h)-1]
			h = h[:len(h)-1]
		}
		h.down(0)
	}
}

// after returns the item of t that follows x (which t holds), or the zero
// value.
func after[T any](t *btree.BTreeG[T], x T) (next T) {
	first := true
	t.AscendGreaterOrEqual(x, func(y T) bool {
		if first {
			first = false
			return true // x itself
		}
		next = y
		return false
	})
	return next
}

// cursor is where the merge in DueRecipients is in one node's queues.
type cursor struct {
	n *nodeQueues
	q *queue
}

// cursors is a min-heap of cursors by their queue's (sendAt, name). It is
// written out rather than container/heap's, whose interface boxes every
// pushed cursor: one allocation per node visited on the relay's hot path.
type cursors []cursor

func (h *cursors) push(c cursor) {
	*h = append(*h, c)
	q := *h
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if !lessQueue(q[i].q, q[parent].q) {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

// down restores the heap after h[i] grew.
func (h cursors) down(i int) {
	for {
		least := i
		for _, c := range []int{2*i + 1, 2*i + 2} {
			if c < len(h) && lessQueue(h[c].q, h[least].q) {
				least = c
			}
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}

// NodeQueued returns how many messages are queued for the recipients of
// node. The relay asks it before it forgets a departed peer.
func (s *Store) NodeQueued(node string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	total := 0
	if n := s.byNode[node]; n != nil {
		for _, st := range n.queues {
			total += st.count()
		}
	}
	return total
}

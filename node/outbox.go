package node

import "github.com/meshnode/meshnode/outbox"

// OutboxView is what an application may do with its node's durable outbox:
// look at it and act as an operator would. Nothing here can reorder,
// acknowledge or lose a queued message behind the relay's back.
type OutboxView interface {
	// Stats is a snapshot of the outbox and of the relay's AIMD limits.
	Stats() OutboxStats
	// DeadLetters lists dead letters matching f, oldest first.
	DeadLetters(f outbox.DLQFilter) ([]outbox.DeadLetter, error)
	// Replay sends matching dead letters again as new messages.
	Replay(f outbox.DLQFilter, opts ...outbox.ReplayOption) (int, error)
	// Purge deletes matching dead letters.
	Purge(f outbox.DLQFilter) (int, error)
	// DropQueue moves every message waiting for target ("actor@node", or a
	// node name for all its actors) to the dead-letter queue with reason
	// "dropped: why (outcome unknown: …)" (a message may have been sent,
	// and run, before it was dropped; Replay brings them back) and returns
	// how many.
	DropQueue(target, why string) (int, error)
	// Err says why the outbox stopped taking writes (ErrStoreFailed: the
	// disk failed a commit it had already written; restart the node to
	// reopen the file), or nil while it takes them.
	Err() error
}

// OutboxStats is the outbox's snapshot with the relay's flow control.
type OutboxStats struct {
	outbox.Stats
	InFlight    int            // AIMD slots held now, all peers
	LimitByPeer map[string]int // current AIMD limit per peer
	// Restores counts streams started again in a new epoch because a
	// receiver had seen sequences this outbox never sent on them, or other
	// messages under them: the outbox went back (restored from a backup).
	Restores uint64
}

// Outbox returns the node's outbox view.
func (n *Node) Outbox() OutboxView { return outboxView{n} }

type outboxView struct{ n *Node }

func (v outboxView) Stats() OutboxStats {
	rs := v.n.relay.Stats()
	return OutboxStats{Stats: v.n.store.Stats(), InFlight: rs.InFlight, LimitByPeer: rs.LimitByPeer, Restores: rs.Restores}
}

func (v outboxView) DeadLetters(f outbox.DLQFilter) ([]outbox.DeadLetter, error) {
	return v.n.store.DeadLetters(f)
}

func (v outboxView) Replay(f outbox.DLQFilter, opts ...outbox.ReplayOption) (int, error) {
	return v.n.store.Replay(f, opts...)
}

func (v outboxView) Purge(f outbox.DLQFilter) (int, error) { return v.n.store.Purge(f) }

func (v outboxView) Err() error { return v.n.store.Err() }

func (v outboxView) DropQueue(target, why string) (int, error) {
	return v.n.store.DropQueue(target, why)
}

package node

import (
	"context"
	"errors"
	"fmt"
)

// Shutdown stops the node gracefully, bounded by ctx:
//
//  1. It stops accepting: a peer's tell is refused (counted in
//     Stats.Stopping), an ask is answered unavailable, and a reliable
//     message is told to come back later, which its sender does without
//     counting an attempt; local Tell and Ask fail with ErrClosed and Spawn
//     too. Reliable sends from this node are still stored.
//  2. It lets every actor handle what is in its mailbox, with the contexts
//     handlers normally get.
//  3. It leaves the cluster and closes as Close does.
//
// If ctx ends before the mailboxes are empty, the node closes at once as
// Close does: the tells still queued are counted as dropped
// (Stats.Dropped), and the reliable messages not yet handled stay with
// their senders, who send them again (their receivers' watermarks have not
// moved); then Shutdown returns ctx's error. Nothing accepted is lost
// without a count. A Shutdown after Close returns nil.
func (n *Node) Shutdown(ctx context.Context) error {
	if n.closed.Load() {
		return nil
	}
	n.draining.Store(true)
	drained := n.drain(ctx)
	if drained != nil {
		n.log.Warn("shutdown: mailboxes not drained in time; closing", "err", drained)
	}
	return errors.Join(drained, n.shutdown(true))
}

// drain waits until every actor's mailbox is empty and idle. A message
// that passed the draining check just before it was set may land after an
// actor was drained, so it passes over all actors until one pass finds
// nothing to wait for (Close drops and counts anything later still).
func (n *Node) drain(ctx context.Context) error {
	for {
		n.actorsMu.RLock()
		actors := make([]*actor, 0, len(n.actors))
		for _, a := range n.actors {
			actors = append(actors, a)
		}
		n.actorsMu.RUnlock()
		busy := false
		for _, a := range actors {
			if s := a.mb.Stats(); s.Depth > 0 || s.Running {
				busy = true
			}
			if err := a.mb.Drain(ctx); err != nil {
				return fmt.Errorf("node: shutdown: %w", err)
			}
		}
		if !busy {
			return nil
		}
	}
}

package node

import (
	"fmt"

	"github.com/meshnode/meshnode/mesh"
)

// GossipKeyring returns the node's gossip keys, as fingerprints: the
// primary one (gossip is encrypted with it) and every installed one
// (gossip encrypted with any of them is accepted).
func (n *Node) GossipKeyring() (mesh.KeyringState, error) {
	if n.membership() == nil {
		return mesh.KeyringState{}, fmt.Errorf("node: gossip keyring: %w", ErrNotStarted)
	}
	return n.membership().Keyring()
}

// InstallGossipKey, UseGossipKey and RemoveGossipKey change the node's
// gossip keyring (persisted in its data directory). Rotating a cluster's
// key without a partition is: install the new key on every member, then
// use it on every member, then remove the old one from every member.
func (n *Node) InstallGossipKey(key []byte) error {
	return n.keyringOp(func(m *mesh.Mesh) error { return m.InstallKey(key) })
}

// UseGossipKey makes an installed key the one gossip is encrypted with.
func (n *Node) UseGossipKey(key []byte) error {
	return n.keyringOp(func(m *mesh.Mesh) error { return m.UseKey(key) })
}

// RemoveGossipKey removes a key that is not the primary one.
func (n *Node) RemoveGossipKey(key []byte) error {
	return n.keyringOp(func(m *mesh.Mesh) error { return m.RemoveKey(key) })
}

func (n *Node) keyringOp(f func(*mesh.Mesh) error) error {
	if n.membership() == nil {
		return fmt.Errorf("node: gossip keyring: %w", ErrNotStarted)
	}
	if err := f(n.membership()); err != nil {
		return fmt.Errorf("node: gossip keyring: %w", err)
	}
	return nil
}

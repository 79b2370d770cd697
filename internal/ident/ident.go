// Package ident holds what names one start of a node, for every package
// that needs it: the default cluster name and the boot id generator. node,
// mesh and transport take them from here, so their defaults cannot drift
// apart.
package ident

import (
	"crypto/rand"
	"encoding/hex"
)

// DefaultCluster is the cluster name when none is configured. node exports
// it as node.DefaultCluster.
const DefaultCluster = "meshnode"

// NewBootID returns a random id that names one start of a node: a peer that
// sees it change knows the node restarted rather than reconnected.
func NewBootID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go >= 1.24)
	return hex.EncodeToString(b[:])
}

package mesh

import "errors"

var (
	// ErrUnreachable means the member is unknown, Dead or Left.
	ErrUnreachable = errors.New("mesh: node unreachable")
	// ErrClosed is returned by operations on a Mesh after Close, Leave or Kill.
	ErrClosed = errors.New("mesh: closed")
	// ErrMetaTooLarge means the encoded node metadata does not fit in a
	// memberlist alive message (MaxMetaSize bytes).
	ErrMetaTooLarge = errors.New("mesh: node metadata too large")
	// ErrBadGossipKey means Config.SecretKey is set but is not 32 bytes (AES-256).
	ErrBadGossipKey = errors.New("mesh: gossip key must be 32 bytes")
	// ErrBadConfig wraps every other Config.Validate failure.
	ErrBadConfig = errors.New("mesh: bad config")
	// ErrRefused is the error the AliveDelegate returns for a peer of another
	// cluster, with undecodable metadata or with no compatible protocol.
	ErrRefused = errors.New("mesh: node refused")
	// ErrKeyMismatch means a peer's gossip could not be decrypted, or it
	// could not decrypt ours: the two use different gossip keys (or one
	// none).
	ErrKeyMismatch = errors.New("mesh: the peer uses a different gossip key")
	// ErrBadMessage means bytes from the network could not be decoded.
	ErrBadMessage = errors.New("mesh: bad message")
	// ErrNoSeedAnswered means a join reached none of its seeds. Its
	// message says why that is usually so.
	ErrNoSeedAnswered = errors.New("mesh: no seed answered the join")
)

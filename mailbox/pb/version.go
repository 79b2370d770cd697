package pb

import "slices"

// ProtocolVersion is the wire protocol version this build speaks. Peers
// exchange the versions they support in Hello and NodeMeta and refuse a peer
// with no version in common.
//
// Version 2 introduced reliable streams (sequence, prev_sequence and attempt
// with new meanings, ttl_ms in place of an absolute expiry, coalesce_key,
// the outbox id in Hello, Origin for forwarded envelopes). A version 1 peer
// would misread them, so it is refused rather than spoken to.
const ProtocolVersion uint32 = 2

// supportedVersions lists every protocol version this build can speak.
var supportedVersions = [...]uint32{ProtocolVersion}

// SupportedVersions returns the protocol versions this build can speak (a
// new slice: callers may keep or modify it).
func SupportedVersions() []uint32 { return slices.Clone(supportedVersions[:]) }

// Compatible reports whether a peer that speaks versions shares one with us.
func Compatible(versions []uint32) bool {
	for _, v := range versions {
		if slices.Contains(supportedVersions[:], v) {
			return true
		}
	}
	return false
}

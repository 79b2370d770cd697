// Package pb holds meshnode's wire schema (meshnode.proto) and the Go code
// generated from it. Regenerate with `make generate`; `make verify-generate`
// fails when the committed code differs from what the schema produces.
package pb

//go:generate protoc --go_out=. --go_opt=paths=source_relative meshnode.proto

// ProtocolVersion is the wire protocol version this build speaks. Peers
// exchange the versions they support in Hello and NodeMeta and refuse a peer
// with no version in common.
const ProtocolVersion uint32 = 1

// SupportedVersions lists every protocol version this build can speak.
var SupportedVersions = []uint32{ProtocolVersion}

// Compatible reports whether a peer that speaks versions shares one with us.
func Compatible(versions []uint32) bool {
	for _, v := range versions {
		for _, s := range SupportedVersions {
			if v == s {
				return true
			}
		}
	}
	return false
}

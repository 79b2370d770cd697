// Package pb holds meshnode's wire schema (meshnode.proto) and the Go code
// generated from it. Regenerate with `make generate`; `make verify-generate`
// fails when the committed code differs from what the schema produces. The
// hand-written helpers (protocol versions) are in version.go.
package pb

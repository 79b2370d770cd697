// Package admin is the daemon's local HTTP/JSON API: members, tell, ask,
// send (reliable), outbox stats, the dead-letter queue, the any-language
// inbox and Prometheus metrics at /metrics.
//
//	cfg := admin.DefaultConfig()
//	cfg.Backend, cfg.Inbox = admin.NodeBackend{Node: n}, inboxes
//	srv, err := admin.New(cfg)       // refuses a non-loopback Addr without a Token
//	if err != nil { ... }
//	srv.Serve(listener)              // one tracked goroutine
//	defer srv.Close()                // idempotent; ends long polls
//
// # Guarantees
//
//   - With a Token, every request needs "Authorization: Bearer <token>"
//     (constant-time compare); without one, Validate refuses any address
//     that is not loopback.
//   - Bad input is a 400 with a JSON {"error": ...} saying what is wrong,
//     never a panic; request bodies are bounded (MaxBody). Full receivers
//     answer 429 with Retry-After and retry_after_ms; unreachable peers 503;
//     unknown actors or inboxes 404; an ack past the stored messages 409.
//   - Metrics are read from snapshots at scrape time; nothing runs between
//     scrapes.
//
// # Decisions where DESIGN.md is silent
//
//   - Bodies: a JSON object becomes a google.protobuf.Struct, any other JSON
//     value a google.protobuf.Value, "raw" (base64) a BytesValue, nothing an
//     empty Struct. Replies and stored messages are shown the same way back:
//     "body" (JSON) or "raw" (base64), with "body_type".
//   - /v1/ask decodes the reply as a Struct (the node needs the reply type);
//     inbox actors reply {"inbox": NAME, "cursor": N}.
//   - The Prometheus text format is written here by hand: client_golang's own
//     dependencies are not in go.sum. The ask latency histogram
//     (meshnode_admin_ask_latency_seconds) is observed on the admin path; the
//     node's mean ask latency over all callers is the gauge
//     meshnode_ask_mean_latency_seconds.
//   - Per-peer transport counters (meshnode_peer_*) and per-actor mailbox
//     metrics (meshnode_mailbox_depth, meshnode_mailbox_drops_total) appear
//     when the Backend implements PeerStatser and ActorStatser, as
//     NodeBackend does through node.Node.
package admin

// Package admin is the daemon's local HTTP/JSON API: members, tell, ask,
// send (reliable), outbox stats, the dead-letter queue, the any-language
// inbox, Prometheus metrics at /metrics, probes (/healthz, /readyz),
// /version and, opt-in, /debug/pprof/.
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
// # Decisions
//
//   - Bodies: a JSON object becomes a google.protobuf.Struct, any other JSON
//     value a google.protobuf.Value, "raw" (base64) a BytesValue, nothing an
//     empty Struct. Replies and stored messages are shown the same way back:
//     "body" (JSON) or "raw" (base64), with "body_type".
//   - /v1/ask decodes the reply as a Struct (the node needs the reply type);
//     inbox actors reply {"inbox": NAME, "cursor": N}.
//   - Errors are {"error", "code", "retry_after_ms", "detail"}: "error" is
//     one sentence (Describe) naming the operation and destination once,
//     "code" the kind of failure for programs (the Code* constants; the CLI
//     turns them into exit codes), "detail" the full chain for bug reports.
//   - /metrics is a client_golang registry: the node's families from
//     package metrics (also usable by applications that embed a node), the
//     inbox's, meshnode_build_info, go_* and process_*.
//   - /healthz (the process serves; Config.Live) and /readyz (Config.Ready) need no
//     token; /version does. /debug/pprof/ exists only with Config.Pprof.
//   - SetToken swaps the token for the requests that follow (the daemon
//     calls it on SIGHUP).
package admin

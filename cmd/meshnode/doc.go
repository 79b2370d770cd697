// Command meshnode is the meshnode daemon and its operator CLI.
//
//	meshnode ca init --dir certs                 # cluster CA (ca.crt, ca.key 0600)
//	meshnode cert issue --name n1 --ca-dir certs # n1.crt, n1.key
//	meshnode keygen --out certs/gossip.key       # gossip encryption key
//	meshnode run --config n1.toml                # the daemon
//	meshnode members                             # talks to the daemon's admin API
//	meshnode send orders@n2 '{"id": 42}' --key order-42
//
// # Guarantees
//
//   - Settings: default < TOML file < MESHNODE_<KEY> < --flag; an unknown
//     TOML key is an error naming it.
//   - SIGINT/SIGTERM: the admin API stops, the node leaves the cluster and
//     closes (queued messages stay on disk), the inbox closes, exit 0.
//   - SIGHUP: the configuration is loaded again; log_level, admin_token and
//     the certificate apply at once (the certificate on new connections),
//     the gossip key file is checked and used from the next start, a
//     configuration that does not load is logged and the running one kept.
//   - Every failure is one line "meshnode: ..." on stderr and a documented
//     exit code (exitcode.go, README.md): 2 usage, 3 start-up, 4 refused,
//     5 not found, 6 remote failure, 10-12 retryable.
//   - Every command that prints a result has --json; client commands give
//     up after --http-timeout beyond what the request itself waits.
//   - Inbox actors append each message durably (fsync) before their handler
//     returns, so a reliable sender's Delivered means it is on disk.
//
// # Decisions
//
//   - The node name defaults to the host name, data_dir to ./meshnode-data,
//     ca_file to certs/ca.crt, and cert_file/key_file to <name>.crt/.key next
//     to ca_file, so `ca init` + `cert issue` + `run --name` just work.
//   - The inbox store (DataDir/inbox.db) is opened before the node, so a
//     second daemon on the same data directory fails fast on its lock; the
//     admin, gossip and QUIC addresses are bound (and released) before the
//     node starts, so a busy port is reported as a bind of the setting that
//     names it, before joining the cluster.
//   - Readiness: /readyz and systemd's READY=1 wait until the node has joined
//     (any other member alive) when seeds are configured. After 20 s without
//     a seed the daemon tells systemd it is ready anyway, with a STATUS line
//     saying it runs alone: a node whose seeds are all down must still start.
//     systemd is spoken to through $NOTIFY_SOCKET directly (sdnotify.go).
//   - Log lines never repeat a key (logging.go): the node, mesh and
//     transport layers each add the node name, and the first one wins.
//   - An inbox is an actor of the same name; inboxes declared at runtime are
//     persisted and re-spawned at start. A full inbox makes the handler fail
//     with a *node.CapacityError (RetryAfter 1 s); an ask to an inbox gets
//     {"inbox": NAME, "cursor": N}. Inbox handlers are timed in
//     meshnode_handler_duration_seconds.
//   - `dlq purge` asks y/N on a terminal (golang.org/x/term); without one, or
//     when no answer can be read, it exits 2 unless --yes is given.
//   - Commands are registered from the `commands` list in root.go, so demo
//     and testnet are one line each.
package main

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
//   - Start-up failures exit 1 with one line "meshnode: ..." saying what to
//     do: bad config, missing certificate, address in use, data directory
//     used by another meshnode.
//   - Inbox actors append each message durably (fsync) before their handler
//     returns, so a reliable sender's Delivered means it is on disk.
//
// # Decisions where DESIGN.md is silent
//
//   - The node name defaults to the host name, data_dir to ./meshnode-data,
//     ca_file to certs/ca.crt, and cert_file/key_file to <name>.crt/.key next
//     to ca_file, so `ca init` + `cert issue` + `run --name` just work.
//   - The inbox store (DataDir/inbox.db) is opened before the node, so a
//     second daemon on the same data directory fails fast on its lock; the
//     admin address is bound before the node starts, so a busy admin port
//     fails before joining the cluster.
//   - An inbox is an actor of the same name; inboxes declared at runtime are
//     persisted and re-spawned at start. A full inbox makes the handler fail
//     with a *node.CapacityError (RetryAfter 1 s); an ask to an inbox gets
//     {"inbox": NAME, "cursor": N}.
//   - Client commands read --admin/--token or MESHNODE_ADMIN_ADDR/TOKEN.
//     `dlq purge` asks y/N on a terminal, and refuses without --yes when
//     stdin is not one.
//   - Commands are registered from the `commands` list in root.go, so demo
//     and testnet are one line each.
package main

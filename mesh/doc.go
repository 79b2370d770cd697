// Package mesh is meshnode's membership layer: a wrapper around
// hashicorp/memberlist that answers "who is in the cluster, is it reachable,
// and where is its QUIC endpoint", and reports changes as events.
//
// # Guarantees
//
//   - Resolve is correct the moment memberlist changes its mind: the
//     delegates write the member view synchronously (a map write under a
//     small lock); Resolve takes only a read lock.
//   - Events are delivered serially to Config.OnEvent from the mesh's own
//     goroutine, never from a memberlist callback. States coalesce: a
//     subscriber always ends up with the latest state of every member, but
//     two quick transitions (Dead then Alive with the same boot id) may be
//     reported as none. A new boot id is always reported (EventRestart).
//   - Peers of another cluster never appear: gossip is labelled
//     "meshnode/"+Cluster (dropped at the packet level) and the AliveDelegate
//     refuses metadata of another cluster, undecodable metadata or no common
//     protocol version, logging the reason once per node.
//   - With a SecretKey, gossip is encrypted and unencrypted or wrongly keyed
//     traffic is refused; a node with the wrong key cannot Join.
//   - A reconnect loop re-joins seeds and failed peers, so the halves of a
//     healed partition merge without help, and peers.json (written
//     atomically, debounced to ReconnectInterval) lets a node restarted
//     without seeds find its cluster.
//   - Close (a graceful leave) and Kill are idempotent and end every goroutine.
//
// # Usage
//
//	cfg := mesh.DefaultConfig("n1")
//	cfg.Cluster = "plant-7"
//	cfg.BindAddr = "10.0.0.5:7946"
//	cfg.Join = []string{"10.0.0.4:7946"}
//	cfg.SecretKey = key32
//	cfg.DataDir = "/var/lib/meshnode"
//	cfg.Meta = &pb.NodeMeta{QuicAddr: "10.0.0.5:7947"} // New fills in the boot id, versions and cluster
//	cfg.OnEvent = func(ev mesh.Event) { log.Println(ev.Kind, ev.Member.Name) }
//	m, err := mesh.New(cfg)
//	if err != nil { ... }
//	defer m.Close()
//	addr, err := m.Resolve("n2") // errors.Is(err, mesh.ErrUnreachable) when down
//
// # Decisions (the architecture and its numbered rules: docs/architecture.md)
//
//   - Left vs Dead. memberlist v0.7.0 passes NotifyLeave a Node whose State
//     is always the zero value (the real state is an unexported field), so it
//     cannot tell a leave from a failure. A leaving node therefore sends a
//     small "leave intent" user message (pb.Hello: name, boot id, cluster)
//     over memberlist's reliable stream to every reachable peer before
//     memberlist.Leave; a peer reports Left when the intent matches the
//     node's boot id, Dead otherwise. An intent that arrives after the death
//     turns Dead into Left.
//   - Suspect. No memberlist delegate reports suspicion, and Members()
//     carries the same zero State. mesh recognises memberlist's own log line
//     for a failed local probe ("Suspect X has failed, no acks received") and
//     marks X Suspect; the next ack from X (PingDelegate) clears it. mesh
//     pings a member that has been Suspect for a ProbeInterval again itself,
//     once per ProbeInterval, since memberlist's next probe of it is a whole
//     round away; an answer clears it too. Alive messages do not: memberlist hands them to
//     the AliveDelegate before its incarnation check, so stale ones (gossip
//     retransmits, push/pull merges) would make Suspect flap. Suspicion
//     raised by other nodes' gossip alone is not visible. Suspect members
//     still resolve.
//   - No events about the local node. Members includes it.
//   - A member learned of only when already dead produces no event.
//   - Dead and left members stay in Members for ReconnectTimeout, then are
//     forgotten (and no longer re-joined). Until then failed (not left)
//     members and peers.json entries are re-joined. A failed member is
//     joined 1, 2, 4, ... 32 ReconnectIntervals after the failure by about
//     eight members of the cluster (each member that sees the failure takes
//     each of these with probability 8/(reachable members)): the quickest
//     repair of a false death, since the push/pull tells the member it was
//     declared dead, and it refutes. Besides, each interval a member tries
//     each failed member and peers.json entry with probability
//     2/(reachable members), so the cluster as a whole makes about two Joins
//     per failed member per interval whatever its size (every member
//     dialling every failed one was n×d dials per interval). Join seeds are
//     tried every interval.
//   - Kill does not write peers.json (a crash would not); Close does.
//   - UpdateMeta waits up to TCPTimeout for the broadcast; a timeout is not
//     an error because gossip and push/pull spread the new metadata anyway.
//   - A panic in OnEvent is recovered and logged.
//   - A node restarted on a new address before DeadNodeReclaimTime passed is
//     refused by memberlist as a name conflict; the ConflictDelegate records
//     the new address and the reconnect loop joins it once the name can be
//     reclaimed (about one ReconnectInterval), instead of the next push/pull.
//   - Gossip compression is off: packets are small on a LAN and lzw was the
//     largest CPU cost in profiles.
//
// # Tuning
//
// DefaultConfig targets a 3-10 node LAN: a killed node is Dead at the others
// within 3 s (measured median 1.5 s, max 1.6 s over 10 trials under -race), a restarted node Alive within 2 s of New, no
// false suspicion in a steady 10-node cluster. Reproduce the figures with
//
//	MESH_MEASURE=1 go test -race -run TestMeasureDetection -v ./mesh/
//
// TestMeasureDetection only runs when MESH_MEASURE=1; the same behaviour is
// asserted by the regular tests.
package mesh

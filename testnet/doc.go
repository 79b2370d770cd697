// Package testnet shows meshnode's claims about faults instead of asserting
// them: in-process clusters on loopback with a fault network shared by
// gossip and data, a seeded nemesis, an invariant checker, and the built-in
// scenarios with plotted reports.
//
//	rec := testnet.NewRecorder(seed)
//	c := testnet.New(t, 5, testnet.WithSpawn(func(i int, n *node.Node) error {
//		_, err := n.Spawn("sink", testnet.RecordingHandler(rec, n, testnet.NoBug))
//		return err
//	}))
//	c.Partition([]int{0, 1}, []int{2, 3, 4})
//	testnet.SendReliable(ctx, rec, c.Node(0), c.Addr("sink", 3)) // Queued
//	c.Heal()
//	c.WaitDrained(10 * time.Second)
//	rep, _ := c.Check(rec)
//	if err := rep.Err(); err != nil { t.Fatal(err) } // prints the random seed
//
// # Guarantees
//
//   - Faults: Cut, Isolate, Partition, Drop, Delay and Heal act on one
//     Network that wraps every node's QUIC socket (transport.Config.WrapPacketConn)
//     and memberlist transport (mesh.Config.WrapTransport), so membership
//     and data see the same network. Wrappers register their own addresses
//     under their node's name when created.
//   - Cluster: New/Start give n converged nodes ("n0".."n<n-1>") with one
//     generated CA and gossip key; Kill is a crash (node.Kill), Stop a
//     graceful close, Restart a new incarnation on the same data directory.
//   - Checker: nothing acknowledged (Delivered or Queued) is lost unless it
//     is in a DLQ with a reason; a key is processed once; per-(sender,
//     recipient) order of first runs holds. Every report prints its seed.
//   - Nemesis: PlanFaults is a pure function of its config; the same seed
//     gives the same schedule, which always ends healed with every node up.
//
// # Decisions (the architecture and its numbered rules: docs/architecture.md)
//
//   - testnet tests meshnode's own claims under faults; an application's
//     tests start their nodes with node/nodetest, which has names, a setup
//     before each start and nothing of the fault network.
//   - Drop does not apply to memberlist TCP streams (reliable by contract);
//     a stream is refused at dial, and an open one fails on its next read
//     or write, when either direction between its nodes is blocked. Delay
//     applies to packets only. Partition adds to earlier faults; the
//     nemesis heals before each partition. Nodes named in no group are not
//     affected by Partition.
//   - Restart binds new ports (port 0) and joins up to three running nodes;
//     the old addresses stay registered under the same name.
//   - Disk faults go through internal/faults: DiskFull fails every commit of
//     a node's outbox until FreeDisks (a full disk); SyncFail makes bbolt's
//     next write of the outbox's meta page reach the file and report an I/O
//     error (a failing fsync), which stops the outbox until the node
//     restarts, so the nemesis plans it like a kill and restarts the node.
//   - A re-run of a key on a later incarnation of the receiver is reported
//     apart ("crash-window re-runs") and does not fail the check: node
//     documents that a crash between a handler's return and the commit of
//     its key can run the handler twice. Re-runs within one incarnation
//     are duplicates and fail it. Cluster.Check treats every ended
//     incarnation (killed or stopped) that way.
//   - Scenarios run on their own cluster and sample the sender nodes'
//     outboxes every 100 ms. The Result carries the SVG; WriteSVG writes it.
//   - Cluster.Close kills the nodes (no graceful leave): a test's end needs
//     no leave broadcast, and it keeps teardown fast.
//
// # Process clusters
//
// ProcCluster (StartProcs, NewProcs) runs the same kind of cluster as real
// `meshnode run` daemons, for crash tests that must be honest: Kill is
// SIGKILL, so what survives is what the daemon had fsynced.
//
//	c := testnet.NewProcs(t, bin, 3, testnet.WithInboxes("box"))
//	out, err := c.Send(0, "box@n1", map[string]int{"n": 1}, "k1") // "Delivered" or "Queued"
//	_ = c.Kill(1)                                              // SIGKILL
//	_ = c.Restart(1)                                           // same config and data dir
//	msgs, err := c.Pull(1, "box", 0, 100)
//
// Decisions: every config joins every other node (a restarted first node
// finds the cluster alone); ports are probed free on 127.0.0.1, and a start
// that loses the race for one to another process (a daemon exits with
// "address in use") is tried again on other ports, up to three times;
// admin requests use no keep-alive, so a killed daemon leaves no idle
// client connection. With WithNetns each daemon runs under `ip netns exec`
// in namespace mnt-<rand>-<i> with 10.213.<rand>.<i+1>/24 on a veth to a
// bridge in mnt-<rand>-hub; nothing is created in the caller's namespace.
// Isolate takes the node's bridge-side link down and Heal brings all up;
// Cut, Drop and Delay exist only in-process (a link carries all of a
// node's traffic). The admin API stays on the namespace's loopback and the
// helpers dial it from an OS thread switched into the namespace (setns),
// so no token and no route from outside are needed. Close deletes every
// namespace, which removes the veths with them. The crash test tells
// the receiver's incarnations apart by the last inbox cursor on disk right
// after its SIGKILL (read from inbox.db before the restart), so a key
// stored again by the next incarnation counts as the documented crash
// window and any other repeat as a duplicate.
//
// # Knobs
//
// TESTNET_CHAOS_SEEDS (e.g. "1,2,3,4,5") and TESTNET_CHAOS_DURATION (e.g.
// "60s") make TestChaos longer; TESTNET_REPORT_DIR keeps the scenario SVGs
// written by TestScenarios. TESTNET_PROC_MESSAGES (default 300) sizes
// TestProcCrashDurability. Larger scenario sizes run through RunScenario
// with LargeSize (meshnode testnet run NAME).
package testnet

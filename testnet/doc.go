// Package testnet shows meshnode's claims about faults instead of asserting
// them: in-process clusters on loopback with a fault network shared by
// gossip and data, a seeded nemesis, an invariant checker, and the seed
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
//	if err := rep.Err(); err != nil { t.Fatal(err) } // prints the seed
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
// # Decisions where DESIGN.md is silent
//
//   - Drop does not apply to memberlist TCP streams (reliable by contract);
//     a stream is refused at dial, and an open one fails on its next read
//     or write, when either direction between its nodes is blocked. Delay
//     applies to packets only. Partition adds to earlier faults; the
//     nemesis heals before each partition. Nodes named in no group are not
//     affected by Partition.
//   - Restart binds new ports (port 0) and joins up to three running nodes;
//     the old addresses stay registered under the same name.
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
// # Knobs
//
// TESTNET_CHAOS_SEEDS (e.g. "1,2,3,4,5") and TESTNET_CHAOS_DURATION (e.g.
// "60s") make TestChaos longer; TESTNET_REPORT_DIR keeps the scenario SVGs
// written by TestScenarios. Larger scenario sizes run through RunScenario
// with LargeSize (meshnode testnet run NAME).
package testnet

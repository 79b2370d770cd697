// Package harness is meshnode's side-by-side benchmark: it measures meshnode
// and what a user would pick instead (NATS core, JetStream) or what bounds it
// (raw quic-go, bbolt) in one process and one run on the same machine, and
// returns a table of figures, comparisons, ratios and the targets of
// the README's Performance section. cmd/meshbench is its command line.
//
//	cfg := harness.DefaultConfig()         // make bench size
//	cfg.Only = []string{harness.PhaseTell} // or all phases
//	rep, err := harness.Run(cfg)
//	if err != nil { ... }
//	rep.WriteTable(os.Stdout)
//	rep.WriteJSON("bench.json")
//
// # Guarantees
//
//   - Every throughput figure ends at the last receive: the sender's rate
//     alone would flatter anything that buffers. Drops at a receiver are
//     counted and printed, never hidden.
//   - Every component runs on loopback with real sockets, real TLS 1.3 and a
//     real disk (WorkDir, not tmpfs): fsync costs what it costs.
//   - Run cleans up its temporary directory and stops every node, server and
//     goroutine it started; a phase that does not reach its end state within
//     Config.Timeout fails with ErrTimeout instead of hanging.
//
// # Decisions
//
//   - A throughput measurement sends Config.N messages or for
//     Config.Duration, whichever ends first, so `make bench` has a bounded
//     run time on any machine.
//   - meshnode Tell honours back-pressure (a *CapacityError from the
//     connection's bounded queue) by waiting up to 1 ms and retrying; NATS
//     publishes into its client buffer and has no back-pressure, and the
//     subscriber's pending limits are lifted so it drops nothing.
//   - The raw quic-go ceiling batches frames with a 64 KiB bufio.Writer, as
//     the transport's lane writer batches frames. Each round also runs it
//     with frames of a tell's mean size on the wire (the first round's bytes
//     per frame sent), reported in the row's note: what quic-go costs for
//     the bytes a tell sends, apart from meshnode's own work.
//   - Durable enqueue: all senders of a level send to one recipient on a
//     node that is not in the cluster (the offline-peer case); one extra,
//     informational row gives each sender its own recipient, which shows how
//     much per-recipient serialisation costs. JetStream publishers share one
//     connection and each waits for its ack. bbolt's Batch gets
//     MaxBatchSize = senders, or a full group would wait MaxBatchDelay
//     (10 ms) and the "ceiling" would be bbolt's timer, not the disk.
//   - The drain backlog is stored with Dispatch in chunks of 1024 (the same
//     envelopes TellReliable builds, one commit per chunk) so a 1M backlog
//     fills in seconds; the drain itself is timed from the start of the
//     returning node (join and handshake included) to its actor's last
//     message, with the rate after the first delivery in the note.
//   - RSS is measured in a child process (this executable, re-executed with
//     MESHBENCH_RSS_CHILD set: see MaybeChild), split into anonymous memory
//     and bbolt's file-backed mmap pages. Below a 1M backlog the target is
//     marked n/a and a linear projection to 1M is printed.
//   - Memory per idle actor is heap plus stacks after GC, divided by the
//     number of actors; the comparison is a goroutine blocked on its own
//     channel, the naive actor design.
package harness

// Package metrics exports a node's state as Prometheus metrics: one
// prometheus.Collector that an application embedding a node registers in its
// own registry, and that the meshnode daemon serves at /metrics.
//
//	c := metrics.New(metrics.ForNode(n))
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(c)                                   // meshnode_* families
//	reg.MustRegister(collectors.NewGoCollector())         // go_* (optional)
//	n.Spawn("orders", c.InstrumentHandler("orders", h))   // meshnode_handler_duration_seconds
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// # Guarantees
//
//   - Collect reads snapshots (node.Stats, node.OutboxStats, transport and
//     mailbox counters) at scrape time; nothing runs between scrapes and
//     Collect never blocks on the node's queues.
//   - Every per-peer family (meshnode_outbox_peer_depth,
//     meshnode_outbox_aimd_limit, meshnode_peer_frames_total,
//     meshnode_peer_bytes_total) has a series for every peer the collector
//     has ever seen, from the first scrape that saw it to the end of the
//     process: a series does not vanish when a connection closes or a
//     peer's queue drains, so rate() and absent() mean what they say.
//   - Counters never go backwards within a process.
//
// # Decisions
//
//   - Metric names are stable and listed in Names; the Grafana dashboard in
//     dist/grafana is checked against that list.
//   - Latency is a histogram with fixed buckets from 100 µs to 10 s
//     (LatencyBuckets): meshnode_ask_duration_seconds for asks observed
//     with ObserveAsk (the daemon's /v1/ask), meshnode_handler_duration_seconds
//     for handlers wrapped with InstrumentHandler. A mean since start hides
//     every change that matters and is not exported.
//   - Mailbox drops are one family, meshnode_mailbox_drops_total{actor,reason};
//     actors that never held a message nor dropped one are left out, so
//     100k idle actors do not flood a scrape.
package metrics

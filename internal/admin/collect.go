package admin

import (
	"slices"

	"github.com/meshnode/meshnode/mesh"
)

// nodeCollector reads the node's, the outbox's and the inbox's snapshots at
// scrape time.
type nodeCollector struct{ s *Server }

func gauge(name, help string, v float64) Family {
	return Family{Name: name, Help: help, Type: "gauge", Samples: []Sample{{Value: v}}}
}

func counter(name, help string, v uint64) Family {
	return Family{Name: name, Help: help, Type: "counter", Samples: []Sample{{Value: float64(v)}}}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (c nodeCollector) Collect() []Family {
	b := c.s.cfg.Backend
	var fams []Family

	byState := map[string]int{}
	for _, st := range []mesh.State{mesh.StateAlive, mesh.StateSuspect, mesh.StateDead, mesh.StateLeft} {
		byState[st.String()] = 0
	}
	for _, m := range b.Members() {
		byState[m.State.String()]++
	}
	members := Family{Name: "meshnode_members", Help: "Cluster members by state, this node included.", Type: "gauge"}
	for _, st := range sortedKeys(byState) {
		members.Samples = append(members.Samples, Sample{Labels: []string{"state", st}, Value: float64(byState[st])})
	}
	fams = append(fams, members)

	ns := b.Stats()
	fams = append(fams,
		Family{Name: "meshnode_tell_total", Help: "Tell calls by outcome.", Type: "counter", Samples: []Sample{
			{Labels: []string{"outcome", "sent"}, Value: float64(ns.TellSent)},
			{Labels: []string{"outcome", "failed"}, Value: float64(ns.TellFailed)},
		}},
		Family{Name: "meshnode_ask_total", Help: "Ask calls by outcome.", Type: "counter", Samples: []Sample{
			{Labels: []string{"outcome", "ok"}, Value: float64(ns.AskOK)},
			{Labels: []string{"outcome", "failed"}, Value: float64(ns.AskFailed)},
		}},
		Family{Name: "meshnode_reliable_total", Help: "TellReliable calls by outcome (direct = Delivered, queued = fsynced in the outbox).", Type: "counter", Samples: []Sample{
			{Labels: []string{"outcome", "direct"}, Value: float64(ns.ReliableDelivered)},
			{Labels: []string{"outcome", "queued"}, Value: float64(ns.ReliableQueued)},
			{Labels: []string{"outcome", "failed"}, Value: float64(ns.ReliableFailed)},
		}},
		gauge("meshnode_ask_mean_latency_seconds", "Mean latency of successful asks made by this node (all callers), since start.", ns.AskMeanLatency.Seconds()),
		Family{Name: "meshnode_admin_ask_latency_seconds", Help: "Latency of asks made through the admin API (/v1/ask), successful or not.", Type: "histogram", Hist: c.s.askLatency.Snapshot()},
		counter("meshnode_mailbox_dropped_total", "Messages dropped by actor mailboxes (DropOldest, DropNewest, closed).", ns.Dropped),
		counter("meshnode_mailbox_refused_full_total", "Messages from peers refused because a mailbox was full.", ns.RefusedFull),
		counter("meshnode_handler_panics_total", "Handler panics recovered.", ns.Panics),
		counter("meshnode_no_such_actor_total", "Messages for an actor that does not exist on this node.", ns.NoSuchActor),
		counter("meshnode_expired_on_arrival_total", "Messages that arrived already expired.", ns.Expired),
		counter("meshnode_dedupe_hits_total", "Reliable messages recognised as duplicates by this receiver.", ns.DedupeHits),
		gauge("meshnode_actors", "Actors running on this node.", float64(ns.Actors)),
	)

	os := b.OutboxStats()
	depth := Family{Name: "meshnode_outbox_peer_depth", Help: "Messages waiting in the outbox per destination node.", Type: "gauge"}
	for _, p := range sortedKeys(os.DepthByPeer) {
		depth.Samples = append(depth.Samples, Sample{Labels: []string{"peer", p}, Value: float64(os.DepthByPeer[p])})
	}
	limit := Family{Name: "meshnode_outbox_aimd_limit", Help: "Current AIMD concurrency limit per destination node.", Type: "gauge"}
	for _, p := range sortedKeys(os.LimitByPeer) {
		limit.Samples = append(limit.Samples, Sample{Labels: []string{"peer", p}, Value: float64(os.LimitByPeer[p])})
	}
	fams = append(fams, depth, limit,
		gauge("meshnode_outbox_depth", "Messages waiting in the outbox, all recipients.", float64(os.Depth)),
		gauge("meshnode_outbox_oldest_age_seconds", "Age of the oldest message waiting in the outbox.", os.OldestAge.Seconds()),
		gauge("meshnode_outbox_in_flight", "Outbox deliveries in flight (limiter slots held).", float64(os.InFlight)),
		gauge("meshnode_outbox_dlq_depth", "Records in the dead-letter queue.", float64(os.DLQDepth)),
		counter("meshnode_outbox_retries_total", "Failed delivery attempts that stayed queued.", os.Retries),
		counter("meshnode_outbox_dead_lettered_total", "Messages moved to the dead-letter queue.", os.DeadLettered),
		counter("meshnode_outbox_expired_total", "Messages that expired (TTL) before delivery.", os.Expired),
		counter("meshnode_outbox_delivered_total", "Messages delivered from the outbox and acknowledged.", os.Delivered),
		counter("meshnode_outbox_enqueued_total", "Messages stored in the outbox.", os.Enqueued),
		counter("meshnode_outbox_coalesced_total", "Waiting messages replaced by a newer OVERWRITE.", os.Coalesced),
		counter("meshnode_outbox_fsyncs_total", "Outbox commits (one fsync each; compare with enqueued for group commit).", os.Fsyncs),
	)

	if ps, ok := b.(PeerStatser); ok {
		frames := Family{Name: "meshnode_peer_frames_total", Help: "Transport frames per peer and direction.", Type: "counter"}
		bytes := Family{Name: "meshnode_peer_bytes_total", Help: "Transport bytes per peer and direction.", Type: "counter"}
		st := ps.PeerStats()
		for _, p := range sortedKeys(st) {
			v := st[p]
			frames.Samples = append(frames.Samples,
				Sample{Labels: []string{"peer", p, "direction", "in"}, Value: float64(v.FramesIn)},
				Sample{Labels: []string{"peer", p, "direction", "out"}, Value: float64(v.FramesOut)})
			bytes.Samples = append(bytes.Samples,
				Sample{Labels: []string{"peer", p, "direction", "in"}, Value: float64(v.BytesIn)},
				Sample{Labels: []string{"peer", p, "direction", "out"}, Value: float64(v.BytesOut)})
		}
		fams = append(fams, frames, bytes)
	}

	if as, ok := b.(ActorStatser); ok {
		depth := Family{Name: "meshnode_mailbox_depth", Help: "Messages queued per actor mailbox.", Type: "gauge"}
		drops := Family{Name: "meshnode_mailbox_drops_total", Help: "Messages dropped or refused per actor mailbox and reason.", Type: "counter"}
		for _, a := range as.ActorStats() {
			if a.Depth == 0 && a.Rejected+a.DroppedOldest+a.DroppedNewest+a.DroppedClosed == 0 {
				continue // idle and never full: 100k such actors would flood every scrape
			}
			depth.Samples = append(depth.Samples, Sample{Labels: []string{"actor", a.Name}, Value: float64(a.Depth)})
			for _, r := range []struct {
				reason string
				v      uint64
			}{{"rejected", a.Rejected}, {"drop-oldest", a.DroppedOldest}, {"drop-newest", a.DroppedNewest}, {"closed", a.DroppedClosed}} {
				drops.Samples = append(drops.Samples, Sample{Labels: []string{"actor", a.Name, "reason", r.reason}, Value: float64(r.v)})
			}
		}
		fams = append(fams, depth, drops)
	}

	if c.s.cfg.Inbox != nil {
		depth := Family{Name: "meshnode_inbox_depth", Help: "Unacknowledged messages per inbox.", Type: "gauge"}
		last := Family{Name: "meshnode_inbox_last_cursor", Help: "Cursor of the newest message per inbox.", Type: "gauge"}
		st := c.s.cfg.Inbox.Stats()
		for _, n := range sortedKeys(st) {
			depth.Samples = append(depth.Samples, Sample{Labels: []string{"inbox", n}, Value: float64(st[n].Depth)})
			last.Samples = append(last.Samples, Sample{Labels: []string{"inbox", n}, Value: float64(st[n].LastCursor)})
		}
		fams = append(fams, depth, last)
	}
	return fams
}

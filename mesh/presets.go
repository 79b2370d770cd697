package mesh

import "time"

// preset is the part of Config that depends on the cluster's size.
type preset struct {
	upTo                          int // largest cluster the preset is for
	probe, probeTimeout, gossip   time.Duration
	pushPull                      time.Duration
	streams, streamBytes, rate    int
	retransmitMult, suspicionMult int
	handoff                       int // HandoffQueueDepth
}

// presets, smallest first. What changes with size, and why:
//
//   - ProbeInterval and ProbeTimeout. Each member probes one peer per
//     interval whatever the size, so probing costs a member the same at
//     10 or 5,000; but a bigger cluster also has more churn to gossip, more
//     hosts under load and longer suspicion timeouts (memberlist multiplies
//     them by log10 n), so the timeout leaves more room for a busy peer.
//   - GossipInterval. A broadcast reaches everyone in O(log n) gossip
//     rounds; a longer round at large n keeps a join wave's alive messages
//     (one per member, each relayed RetransmitMult*log10(n+1) times) from
//     saturating a member's uplink.
//   - PushPullInterval. A push/pull sends the whole member list (~250 bytes
//     per member), and memberlist already stretches the interval by
//     log2(n/32)+1 above 32 members; the preset stretches it more so the
//     bytes per member per second stay small.
//   - InboundStreams, InboundStreamBytes, InboundStreamRate. One push/pull
//     must fit the byte limit with room for MaxMetaSize metadata; the rate
//     must admit a join wave's member lists.
//   - HandoffQueueDepth. A wave of deaths, restarts or joins reaches every
//     member as a burst of suspect, dead and alive messages; memberlist's
//     1,024 overflowed at 200 members and dropped refutations, which kept
//     live members dead in some views and fed a storm of suspicions.
//
// SuspicionMult and the rest not named here keep their DefaultConfig
// values up to 256 members, which is what the detection bounds
// (dead <= 3 s, alive <= 2 s) are measured with. Up to 256 the probe is
// shorter than DefaultConfig's, 250 ms: the suspicion timeout is
// SuspicionMult x log10(n) x ProbeInterval (1.15 s at 200), and with
// 300 ms 2 of 15 deaths at 200 members took 3.01-3.04 s to reach everyone
// on a slower machine; with 250 ms, 1.62-2.33 s.
var presets = []preset{
	{upTo: 16, probe: 300 * time.Millisecond, probeTimeout: 150 * time.Millisecond, gossip: 50 * time.Millisecond,
		pushPull: 5 * time.Second, streams: 16, streamBytes: 1 << 20, rate: 4 << 20, retransmitMult: 4, suspicionMult: 2, handoff: 1024},
	{upTo: 256, probe: 250 * time.Millisecond, probeTimeout: 150 * time.Millisecond, gossip: 50 * time.Millisecond,
		pushPull: 10 * time.Second, streams: 32, streamBytes: 1 << 20, rate: 8 << 20, retransmitMult: 4, suspicionMult: 2, handoff: 8192},
	{upTo: 1024, probe: time.Second, probeTimeout: 500 * time.Millisecond, gossip: 100 * time.Millisecond,
		pushPull: 30 * time.Second, streams: 32, streamBytes: 2 << 20, rate: 16 << 20, retransmitMult: 4, suspicionMult: 2, handoff: 8192},
	{upTo: 8192, probe: 2 * time.Second, probeTimeout: time.Second, gossip: 200 * time.Millisecond,
		pushPull: 60 * time.Second, streams: 32, streamBytes: 8 << 20, rate: 32 << 20, retransmitMult: 4, suspicionMult: 2, handoff: 8192},
}

// PresetFor returns DefaultConfig(nodeName) tuned for a cluster of about
// clusterSize members: the smallest preset whose size is at least
// clusterSize (the largest, 8,192, beyond that). Presets change
// ProbeInterval, ProbeTimeout, GossipInterval, PushPullInterval,
// RetransmitMult, SuspicionMult, HandoffQueueDepth and the inbound stream
// limits; see
// docs/fleet-scale.md for the figures each was measured at.
//
//	size      probe / timeout   gossip   push/pull   stream bytes
//	<= 16     300 / 150 ms      50 ms    5 s         1 MiB
//	<= 256    250 / 150 ms      50 ms    10 s        1 MiB
//	<= 1024   1 s / 500 ms      100 ms   30 s        2 MiB
//	<= 8192   2 s / 1 s         200 ms   60 s        8 MiB
//
// Every member of a cluster should use the same preset: suspicion and
// retransmission are computed locally, but a member with a much longer
// ProbeTimeout than its peers' ProbeInterval helps their indirect probes
// late.
func PresetFor(nodeName string, clusterSize int) Config {
	c := DefaultConfig(nodeName)
	p := presets[len(presets)-1]
	for _, q := range presets {
		if clusterSize <= q.upTo {
			p = q
			break
		}
	}
	c.ProbeInterval, c.ProbeTimeout, c.GossipInterval = p.probe, p.probeTimeout, p.gossip
	c.PushPullInterval = p.pushPull
	c.InboundStreams, c.InboundStreamBytes, c.InboundStreamRate = p.streams, p.streamBytes, p.rate
	c.RetransmitMult, c.SuspicionMult = p.retransmitMult, p.suspicionMult
	c.HandoffQueueDepth = p.handoff
	return c
}

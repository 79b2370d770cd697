package mesh

import (
	"time"

	"github.com/hashicorp/memberlist"
)

// delegate implements memberlist's Delegate, EventDelegate, AliveDelegate,
// ConflictDelegate and PingDelegate. memberlist calls most of these with its
// node lock held, so every method only reads its arguments, writes the view
// under Mesh.mu and kicks the dispatcher; none blocks or calls memberlist.
type delegate struct{ m *Mesh }

var (
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.EventDelegate    = (*delegate)(nil)
	_ memberlist.AliveDelegate    = (*delegate)(nil)
	_ memberlist.ConflictDelegate = (*delegate)(nil)
	_ memberlist.PingDelegate     = (*delegate)(nil)
)

// NodeMeta returns the encoded metadata, already checked against the limit.
func (d *delegate) NodeMeta(limit int) []byte {
	b := *d.m.meta.Load()
	if len(b) > limit {
		return nil // unreachable: encodeMeta enforces MaxMetaSize
	}
	return b
}

// NotifyMsg receives leave intents sent by peers just before they leave.
func (d *delegate) NotifyMsg(b []byte) {
	h, err := decodeLeaveIntent(b)
	if err != nil {
		d.m.log.Debug("mesh: dropping user message", "err", err)
		return
	}
	if h.GetCluster() != d.m.cfg.Cluster {
		return
	}
	d.m.recordLeaveIntent(h.GetNodeName(), h.GetBootId())
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// NotifyJoin: a node became alive (new, or back from dead or left).
func (d *delegate) NotifyJoin(n *memberlist.Node) { d.m.setFromNode(n, StateAlive) }

// NotifyLeave: a node is dead or left. memberlist v0.7.0 leaves n.State at
// its zero value (the real state lives in an unexported field), so Left is
// recognised from the leave intent the node sent (see doc.go).
func (d *delegate) NotifyLeave(n *memberlist.Node) { d.m.setFromNode(n, StateDead) }

// NotifyUpdate: an alive message with new metadata (possibly a restart that
// was never noticed as a failure); memberlist now holds the node alive.
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.m.setFromNode(n, StateAlive) }

// NotifyAlive filters peers. It does not end a suspicion: memberlist calls
// it before its incarnation check, so retransmitted or merged (stale) alive
// messages reach it too; only an ack (NotifyPingComplete) does.
func (d *delegate) NotifyAlive(n *memberlist.Node) error {
	if n.Name == d.m.cfg.NodeName {
		return nil
	}
	if err := checkPeer(d.m.cfg.Cluster, n.Meta); err != nil {
		d.m.logRefusal(n.Name, err)
		return err
	}
	return nil
}

// NotifyConflict: two nodes claim one name from different addresses. Most
// often the node restarted on a new address before DeadNodeReclaimTime
// passed; the new address is remembered so the reconnect loop contacts it
// once the name can be reclaimed, instead of waiting for a push/pull.
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	d.m.log.Debug("mesh: name conflict", "peer", existing.Name,
		"known_addr", existing.Address(), "other_addr", other.Address())
	d.m.recordMoved(existing.Name, other.Address())
}

func (d *delegate) AckPayload() []byte { return nil }

// NotifyPingComplete: a probe got an ack, so the node is not suspect.
func (d *delegate) NotifyPingComplete(other *memberlist.Node, _ time.Duration, _ []byte) {
	d.m.clearSuspect(other.Name)
}

package mesh

import (
	"maps"
	"slices"
	"strconv"
	"time"
)

// State is a member's reachability as this node sees it.
type State int

const (
	// StateAlive: the member answers probes.
	StateAlive State = iota + 1
	// StateSuspect: a probe of this node failed; the member may be dead.
	// It is still reachable for Resolve: suspicion is often refuted.
	StateSuspect
	// StateDead: memberlist declared the member failed (no leave).
	StateDead
	// StateLeft: the member announced its leave.
	StateLeft
)

// String returns "alive", "suspect", "dead" or "left".
func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// reachable reports whether messages may be sent to a member in state s.
func (s State) reachable() bool { return s == StateAlive || s == StateSuspect }

// Member is one node of the cluster as this node knows it.
type Member struct {
	Name             string
	GossipAddr       string // memberlist host:port
	QUICAddr         string // from NodeMeta
	BootID           string // from NodeMeta; changes on every start
	Cluster          string // from NodeMeta
	ProtocolVersions []uint32
	Tags             map[string]string // from NodeMeta: the application's member tags
	Features         []string          // from NodeMeta: optional capabilities it advertises (e.g. "forward")
	State            State
	Since            time.Time // when State last changed (local clock)
}

func (m Member) clone() Member {
	m.ProtocolVersions = append([]uint32(nil), m.ProtocolVersions...)
	m.Tags = maps.Clone(m.Tags)
	m.Features = slices.Clone(m.Features)
	return m
}

// EventKind says what changed about a member.
type EventKind int

const (
	// EventJoin: a member seen for the first time (or after it was forgotten).
	EventJoin EventKind = iota + 1
	// EventAlive: a member is back from Suspect, Dead or Left with the same boot id.
	EventAlive
	// EventSuspect: a member became Suspect.
	EventSuspect
	// EventDead: a member was declared failed.
	EventDead
	// EventLeft: a member left gracefully.
	EventLeft
	// EventRestart: a member with a known name came back with a new boot id.
	EventRestart
	// EventUpdate: a member's metadata (tags included) or address changed,
	// state unchanged.
	EventUpdate
)

// String returns the event name in lower case.
func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventAlive:
		return "alive"
	case EventSuspect:
		return "suspect"
	case EventDead:
		return "dead"
	case EventLeft:
		return "left"
	case EventRestart:
		return "restart"
	case EventUpdate:
		return "update"
	}
	return "event(" + strconv.Itoa(int(k)) + ")"
}

// Event reports a change of one member, delivered to Config.OnEvent.
type Event struct {
	Kind   EventKind
	Member Member
}

// diff computes the event that takes a subscriber from prev (ok=false: never
// published) to cur. It returns false when nothing worth reporting changed.
func diff(prev Member, known bool, cur Member) (EventKind, bool) {
	if !known {
		if cur.State.reachable() {
			return EventJoin, true
		}
		return 0, false // learned about it already dead: nothing to report
	}
	if cur.State.reachable() && prev.BootID != "" && cur.BootID != "" && prev.BootID != cur.BootID {
		return EventRestart, true
	}
	if prev.State != cur.State {
		switch cur.State {
		case StateAlive:
			return EventAlive, true
		case StateSuspect:
			if prev.State != StateAlive {
				return EventAlive, true // back from dead straight into suspicion
			}
			return EventSuspect, true
		case StateDead:
			return EventDead, true
		case StateLeft:
			return EventLeft, true
		}
	}
	if prev.GossipAddr != cur.GossipAddr || prev.QUICAddr != cur.QUICAddr ||
		prev.Cluster != cur.Cluster || !equalVersions(prev.ProtocolVersions, cur.ProtocolVersions) ||
		!maps.Equal(prev.Tags, cur.Tags) || !slices.Equal(prev.Features, cur.Features) {
		return EventUpdate, true
	}
	return 0, false
}

func equalVersions(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

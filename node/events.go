package node

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/mesh"
)

// MemberEventKind says what changed about a member.
type MemberEventKind = mesh.EventKind

// The kinds of membership events.
const (
	MemberJoin    = mesh.EventJoin    // seen for the first time (or after it was forgotten)
	MemberAlive   = mesh.EventAlive   // back from suspect, dead or left with the same boot id
	MemberSuspect = mesh.EventSuspect // a probe failed: it may be dead
	MemberDead    = mesh.EventDead    // declared failed
	MemberLeft    = mesh.EventLeft    // left gracefully
	MemberRestart = mesh.EventRestart // back with a new boot id: a new incarnation
	MemberUpdate  = mesh.EventUpdate  // its tags or addresses changed
)

// MemberEvent is one change of a member as this node saw it.
type MemberEvent struct {
	Kind   MemberEventKind
	Member Member // read-only: subscribers share it
	// Missed counts the events this subscriber lost just before this one
	// because it did not keep up; Members has the state they changed.
	Missed int
}

// memberCallbackQueue bounds the events waiting for the application's
// callback (Config.Mesh.OnEvent).
const memberCallbackQueue = 1024

// memberCallbackWait is how long Close waits for the application's
// callback to return before it goes on without it.
const memberCallbackWait = 5 * time.Second

// memberEvents hands membership events to the application: to the
// callback it set in Config.Mesh.OnEvent, on a goroutine of its own, and to
// MemberEvents subscribers. Nothing here blocks mesh's dispatcher, which
// runs the node's own reaction first: a slow or stuck application loses
// events (counted), never gossip or the node's failure handling.
type memberEvents struct {
	n        *Node
	callback func(mesh.Event) // nil: none
	queue    chan mesh.Event  // to the callback's goroutine
	done     chan struct{}    // closed when the callback's goroutine ended

	// mu guards the field below.
	mu   sync.Mutex
	subs map[chan MemberEvent]*int // subscriber -> events missed since its last one
}

func newMemberEvents(n *Node, callback func(mesh.Event)) *memberEvents {
	e := &memberEvents{n: n, callback: callback, subs: map[chan MemberEvent]*int{}, done: make(chan struct{})}
	if callback == nil {
		close(e.done)
		return e
	}
	e.queue = make(chan mesh.Event, memberCallbackQueue)
	go e.run()
	return e
}

// run calls the application's callback, one event at a time, until the
// node's context ends.
func (e *memberEvents) run() {
	defer close(e.done)
	for {
		select {
		case <-e.n.ctx.Done():
			return
		case ev := <-e.queue:
			e.call(ev)
		}
	}
}

func (e *memberEvents) call(ev mesh.Event) {
	defer func() {
		if r := recover(); r != nil {
			e.n.log.Error("member event callback panicked", "event", ev.Kind.String(), "peer", ev.Member.Name, "panic", r)
		}
	}()
	e.callback(ev)
}

// wait waits for the callback's goroutine after the node's context ended,
// at most memberCallbackWait: a callback that never returns is logged and
// left behind rather than allowed to hang Close.
func (e *memberEvents) wait() {
	select {
	case <-e.done:
	case <-time.After(memberCallbackWait):
		e.n.log.Error("member event callback still running after close; not waited for")
	}
}

// publish runs on mesh's dispatcher goroutine: it never blocks.
func (e *memberEvents) publish(ev mesh.Event) {
	if e.queue != nil {
		select {
		case e.queue <- ev:
		default:
			e.n.stats.memberEventsMissed.Add(1)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for ch, missed := range e.subs {
		select {
		case ch <- MemberEvent{Kind: ev.Kind, Member: ev.Member, Missed: *missed}:
			*missed = 0
		default:
			*missed++
			e.n.stats.memberEventsMissed.Add(1)
		}
	}
}

// MemberEvents returns the changes of membership this node sees from now
// on (never about itself), buffered up to buffer events. It never blocks
// gossip: a subscriber more than buffer events behind loses the newest,
// counted in the Missed of its next event and in Stats.MemberEventsMissed.
// The channel is closed when ctx ends or the node closes. It may be called
// before Start.
func (n *Node) MemberEvents(ctx context.Context, buffer int) <-chan MemberEvent {
	ch := make(chan MemberEvent, max(buffer, 1))
	if n.closed.Load() {
		close(ch)
		return ch
	}
	e := n.events
	e.mu.Lock()
	e.subs[ch] = new(int)
	e.mu.Unlock()
	n.wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-n.ctx.Done():
		}
		e.mu.Lock()
		delete(e.subs, ch)
		e.mu.Unlock()
		close(ch)
	})
	return ch
}

// worstQUICAddr is the longest QUIC address a node may advertise.
const worstQUICAddr = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"

// nodeMeta is this node's gossip metadata.
func (n *Node) nodeMeta(quicAddr string, tags map[string]string) *pb.NodeMeta {
	return &pb.NodeMeta{
		QuicAddr:         quicAddr,
		BootId:           n.bootID,
		ProtocolVersions: pb.SupportedVersions(),
		Cluster:          n.cfg.Cluster,
		Features:         n.features(),
		Tags:             tags,
	}
}

// checkTags reports whether tags fit in memberlist's metadata with the
// longest address and boot id a node of this cluster can have.
func checkTags(cluster string, tags map[string]string) error {
	meta := &pb.NodeMeta{
		QuicAddr:         worstQUICAddr,
		BootId:           ident.NewBootID(), // as long as the node's own
		ProtocolVersions: pb.SupportedVersions(),
		Cluster:          cluster,
		Features:         []string{FeatureForward},
		Tags:             tags,
	}
	if err := mesh.CheckMeta(meta); err != nil {
		return fmt.Errorf("member tags: %w", err)
	}
	return nil
}

// SetTags replaces this node's member tags (Config.Tags) and gossips them;
// peers see a MemberUpdate. Tags that do not fit in memberlist's 512-byte
// metadata with the node's own fields give an error wrapping
// mesh.ErrMetaTooLarge, and the current tags stay.
func (n *Node) SetTags(tags map[string]string) error {
	if err := checkTags(n.cfg.Cluster, tags); err != nil {
		return fmt.Errorf("node: set tags: %w", err)
	}
	n.metaMu.Lock()
	defer n.metaMu.Unlock()
	n.tags = maps.Clone(tags)
	if n.quicAddr == "" {
		return nil // Start gossips them
	}
	if err := n.membership().UpdateMeta(n.nodeMeta(n.quicAddr, n.tags)); err != nil {
		return fmt.Errorf("node: set tags: %w", err)
	}
	return nil
}

// Tags returns this node's member tags.
func (n *Node) Tags() map[string]string {
	n.metaMu.Lock()
	defer n.metaMu.Unlock()
	return maps.Clone(n.tags)
}

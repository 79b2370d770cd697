package metrics

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/transport"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
)

// Source is what the collector reads at scrape time. ForNode adapts a
// *node.Node; tests and other embeddings may provide their own.
type Source interface {
	Name() string // this node's name, left out of the per-peer series
	Members() []mesh.Member
	Stats() node.Stats
	OutboxStats() node.OutboxStats
	ActorStats() []node.ActorStats
	PeerStats() map[string]transport.PeerStats
}

// ForNode adapts a node to Source.
func ForNode(n *node.Node) Source { return nodeSource{n} }

type nodeSource struct{ *node.Node }

func (s nodeSource) OutboxStats() node.OutboxStats { return s.Outbox().Stats() }

// LatencyBuckets are the upper bounds, in seconds, of the latency
// histograms: 100 µs to 10 s, roughly ×2.5 per step.
var LatencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Names lists every metric family the Collector exports (histograms by
// their base name), sorted.
var Names = func() []string {
	var out []string
	for _, d := range descs {
		out = append(out, d.name)
	}
	out = append(out, "meshnode_ask_duration_seconds", "meshnode_handler_duration_seconds")
	slices.Sort(out)
	return out
}()

type desc struct {
	name, help string
	labels     []string
	typ        prometheus.ValueType
	d          *prometheus.Desc
}

func newDesc(name, help string, typ prometheus.ValueType, labels ...string) *desc {
	return &desc{name: name, help: help, labels: labels, typ: typ, d: prometheus.NewDesc(name, help, labels, nil)}
}

var (
	dMembers        = newDesc("meshnode_members", "Cluster members this node knows, by state, this node included.", prometheus.GaugeValue, "state")
	dTell           = newDesc("meshnode_tell_total", "Tell calls by outcome: sent (handed to a mailbox or connection) or failed.", prometheus.CounterValue, "outcome")
	dAsk            = newDesc("meshnode_ask_total", "Ask calls by outcome: ok (a reply) or failed.", prometheus.CounterValue, "outcome")
	dReliable       = newDesc("meshnode_reliable_total", "TellReliable calls by outcome: direct (Delivered), queued (stored in the outbox) or failed.", prometheus.CounterValue, "outcome")
	dRefusedFull    = newDesc("meshnode_mailbox_refused_full_total", "Messages from peers refused because the recipient's mailbox was full.", prometheus.CounterValue)
	dPanics         = newDesc("meshnode_handler_panics_total", "Handler panics recovered.", prometheus.CounterValue)
	dNoSuchActor    = newDesc("meshnode_no_such_actor_total", "Messages for an actor that does not exist on this node.", prometheus.CounterValue)
	dExpiredArrival = newDesc("meshnode_expired_on_arrival_total", "Messages that arrived after their TTL.", prometheus.CounterValue)
	dDedupe         = newDesc("meshnode_dedupe_hits_total", "Reliable messages this receiver recognised as already processed, by the stream's watermark or an idempotency key (processed once, acknowledged again).", prometheus.CounterValue)
	dStreamRefused  = newDesc("meshnode_stream_refused_total", "Reliable messages this receiver did not run, by reason: out_of_order (its predecessor has not run here; the sender resends from it), forgotten (older than a stream this node forgot after its retention; the sender dead-letters it), diverged (the sender's outbox went back, e.g. restored from a backup: it starts a new epoch of the stream) or store_failed (this node's store stopped after a failed sync; the sender waits until it restarts).", prometheus.CounterValue, "reason")
	dActors         = newDesc("meshnode_actors", "Actors running on this node.", prometheus.GaugeValue)

	dIdentity       = newDesc("meshnode_identity_mismatches_total", "Connections refused because the peer's certificate names another node than the one dialed, or than its Hello claims (an impostor at a member's address, or a node moved without its certificate).", prometheus.CounterValue)
	dHandshakes     = newDesc("meshnode_handshakes_refused_total", "QUIC handshakes refused for the client's certificate, by reason: unknown_ca (not the cluster CA), no_certificate, bad_certificate (expired, wrong use, unreadable).", prometheus.CounterValue, "reason")
	dClaims         = newDesc("meshnode_sender_mismatches_total", "Envelopes refused because they named another node than the verified peer as their sender or as the node to reply to.", prometheus.CounterValue)
	dForgedReplies  = newDesc("meshnode_ask_responses_refused_total", "Ask responses refused because they came from another node than the one asked.", prometheus.CounterValue)
	dFwdRefused     = newDesc("meshnode_forwarded_refused_total", "Forwarded envelopes refused because their origin did not verify (certificate not of the cluster CA or not the named node's, signature not matching the envelope): a forwarder altered or forged them. Nothing ran; the sender tries another route.", prometheus.CounterValue)
	dForwarded      = newDesc("meshnode_forwarded_total", "Forwarded reliable envelopes by event: sent (signed and handed to a forwarder), unsigned_receipt and bad_receipt (receipts through a forwarder ignored: not signed by the recipient, or not verifying), carried (for other members), not_carried, accepted (origin verified here).", prometheus.CounterValue, "event")
	dPeerBytesLimit = newDesc("meshnode_peer_bytes_refused_total", "Messages refused because their sender's messages already held its share of this node's mailboxes (PeerQueuedBytes).", prometheus.CounterValue)

	dOutboxDepth    = newDesc("meshnode_outbox_depth", "Messages waiting in the outbox, all recipients.", prometheus.GaugeValue)
	dOutboxOldest   = newDesc("meshnode_outbox_oldest_age_seconds", "Age of the oldest message waiting in the outbox; 0 when it is empty.", prometheus.GaugeValue)
	dOutboxInFlight = newDesc("meshnode_outbox_in_flight", "Outbox deliveries in flight (AIMD slots held), all peers.", prometheus.GaugeValue)
	dDLQDepth       = newDesc("meshnode_outbox_dlq_depth", "Records in the dead-letter queue.", prometheus.GaugeValue)
	dRetries        = newDesc("meshnode_outbox_retries_total", "Failed delivery attempts after which the message stayed queued.", prometheus.CounterValue)
	dDeadLettered   = newDesc("meshnode_outbox_dead_lettered_total", "Messages moved to the dead-letter queue (rejected, expired or out of attempts).", prometheus.CounterValue)
	dExpired        = newDesc("meshnode_outbox_expired_total", "Messages whose TTL passed before delivery.", prometheus.CounterValue)
	dDelivered      = newDesc("meshnode_outbox_delivered_total", "Messages delivered from the outbox and acknowledged by the recipient.", prometheus.CounterValue)
	dEnqueued       = newDesc("meshnode_outbox_enqueued_total", "Messages stored in the outbox.", prometheus.CounterValue)
	dCoalesced      = newDesc("meshnode_outbox_coalesced_total", "Waiting messages replaced by a newer one with the same overwrite key.", prometheus.CounterValue)
	dCommits        = newDesc("meshnode_outbox_fsyncs_total", "Outbox write transactions committed; each syncs the file to disk (bbolt: two fdatasyncs). Fewer than enqueued means group commit is batching.", prometheus.CounterValue)
	dRestores       = newDesc("meshnode_outbox_stream_restores_total", "Streams this node started again in a new epoch because a receiver had seen sequences its outbox never sent on them, or other messages under them: the outbox went back (restored from a backup). Messages it sent after the backup are unknown to it; alert on any increase.", prometheus.CounterValue)
	dForgotten      = newDesc("meshnode_outbox_streams_forgotten_total", "Receiver streams this node forgot after they were idle for the stream retention (their watermarks and the inboxes' records of them).", prometheus.CounterValue)
	dCommitFails    = newDesc("meshnode_outbox_commit_failures_total", "Outbox write transactions that failed (a full or failing disk). Sends in them returned the error; acks of delivered messages are retried.", prometheus.CounterValue)
	dOutboxFailed   = newDesc("meshnode_outbox_failed", "1 when the outbox stopped taking writes because the disk failed a commit it had already written (its fsync); the node must be restarted. 0 otherwise; alert on 1.", prometheus.GaugeValue)

	dPeerDepth  = newDesc("meshnode_outbox_peer_depth", "Messages waiting in the outbox for one destination node.", prometheus.GaugeValue, "peer")
	dPeerLimit  = newDesc("meshnode_outbox_aimd_limit", "Current AIMD limit of outbox deliveries in flight to one destination node.", prometheus.GaugeValue, "peer")
	dPeerFrames = newDesc("meshnode_peer_frames_total", "QUIC frames exchanged with one peer, by direction.", prometheus.CounterValue, "peer", "direction")
	dGossip     = newDesc("meshnode_gossip_bytes_total", "Gossip bytes (membership: probes, gossip, push/pull, joins) this node sent and received, by direction.", prometheus.CounterValue, "direction")
	dConns      = newDesc("meshnode_connections", "QUIC connections open to peers now (idle ones are closed after transport.Config.IdleConnTimeout).", prometheus.GaugeValue)
	dPeerBytes  = newDesc("meshnode_peer_bytes_total", "QUIC payload bytes exchanged with one peer, by direction.", prometheus.CounterValue, "peer", "direction")
	dPeerWrites = newDesc("meshnode_peer_writes_total", "QUIC stream writes that carried this node's frames to one peer; frames out per write is how many frames one write took (frames queued while a write was under way go out together).", prometheus.CounterValue, "peer")

	dMailboxDepth = newDesc("meshnode_mailbox_depth", "Messages queued in one actor's mailbox (actors that never held a message are left out).", prometheus.GaugeValue, "actor")
	dMailboxDrops = newDesc("meshnode_mailbox_drops_total", "Messages one actor's mailbox dropped or refused, by reason: rejected (full), drop-oldest, drop-newest, closed.", prometheus.CounterValue, "actor", "reason")
)

var descs = []*desc{dMembers, dTell, dAsk, dReliable, dRefusedFull, dPanics, dNoSuchActor, dExpiredArrival, dDedupe, dStreamRefused, dActors,
	dIdentity, dHandshakes, dClaims, dForgedReplies, dPeerBytesLimit, dFwdRefused, dForwarded,
	dOutboxDepth, dOutboxOldest, dOutboxInFlight, dDLQDepth, dRetries, dDeadLettered, dExpired, dDelivered, dEnqueued, dCoalesced, dCommits, dCommitFails, dOutboxFailed, dRestores, dForgotten,
	dConns, dGossip, dPeerDepth, dPeerLimit, dPeerFrames, dPeerBytes, dPeerWrites, dMailboxDepth, dMailboxDrops}

// Collector is a prometheus.Collector of one node's metrics. It is safe for
// concurrent scrapes and observations.
type Collector struct {
	src   Source
	calls *Calls

	// mu guards the fields below: the peers seen so far, so that per-peer
	// series stay for the life of the process.
	mu    sync.Mutex
	peers map[string]bool
}

// Option configures a Collector.
type Option func(*Collector)

// WithCalls makes the collector export c's histograms, which c's
// interceptors fill (see Calls). Without it the collector has histograms
// of its own, filled by ObserveAsk and InstrumentHandler.
func WithCalls(c *Calls) Option { return func(col *Collector) { col.calls = c } }

// New returns a collector reading src.
func New(src Source, opts ...Option) *Collector {
	c := &Collector{src: src, peers: map[string]bool{}}
	for _, opt := range opts {
		opt(c)
	}
	if c.calls == nil {
		c.calls = NewCalls()
	}
	return c
}

// Calls observes a node's asks and handler runs as interceptors: its
// histograms are meshnode_ask_duration_seconds{outcome} (every Ask of the
// node, from the call to its reply or failure) and
// meshnode_handler_duration_seconds{actor,outcome} (every handler run of
// the node's actors). Make it before the node, install it in the node's
// config, and give it to the collector:
//
//	calls := metrics.NewCalls()
//	calls.Install(&cfg)
//	n, err := node.Open(cfg)
//	col := metrics.New(metrics.ForNode(n), metrics.WithCalls(calls))
type Calls struct {
	ask     *prometheus.HistogramVec
	handler *prometheus.HistogramVec
}

// NewCalls returns empty histograms.
func NewCalls() *Calls {
	return &Calls{
		ask: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "meshnode_ask_duration_seconds",
			Help:    "Time from sending an ask to its reply or failure, by outcome.",
			Buckets: LatencyBuckets,
		}, []string{"outcome"}),
		handler: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "meshnode_handler_duration_seconds",
			Help:    "Time a handler took per message, by actor and outcome.",
			Buckets: LatencyBuckets,
		}, []string{"actor", "outcome"}),
	}
}

// Install appends c's interceptors to cfg's (innermost: they time the
// send and the handler, not the other interceptors).
func (c *Calls) Install(cfg *node.Config) {
	cfg.ClientInterceptors = append(cfg.ClientInterceptors, c.ClientInterceptor)
	cfg.ServerInterceptors = append(cfg.ServerInterceptors, c.ServerInterceptor)
}

// ClientInterceptor observes each Ask's latency and outcome.
func (c *Calls) ClientInterceptor(ctx context.Context, call *node.Call, next node.Invoker) error {
	if call.Kind != node.CallAsk {
		return next(ctx, call)
	}
	start := time.Now()
	err := next(ctx, call)
	c.ask.WithLabelValues(outcome(err)).Observe(time.Since(start).Seconds())
	return err
}

// ServerInterceptor observes each handler run's duration by actor.
func (c *Calls) ServerInterceptor(ctx context.Context, m *node.Message, next node.Handler) (proto.Message, error) {
	start := time.Now()
	reply, err := next(ctx, m)
	c.handler.WithLabelValues(m.Recipient().Actor, outcome(err)).Observe(time.Since(start).Seconds())
	return reply, err
}

func outcome(err error) string {
	if err != nil {
		return "failed"
	}
	return "ok"
}

// ObserveAsk records one ask's latency and outcome, for an ask the
// collector's Calls do not see (an ask of another node's API, say).
func (c *Collector) ObserveAsk(d time.Duration, err error) {
	c.calls.ask.WithLabelValues(outcome(err)).Observe(d.Seconds())
}

// InstrumentHandler wraps h so that each call's duration is observed in
// meshnode_handler_duration_seconds{actor=actor}. A node with the Calls'
// interceptors installed observes every handler already.
func (c *Collector) InstrumentHandler(actor string, h node.Handler) node.Handler {
	ok, failed := c.calls.handler.WithLabelValues(actor, "ok"), c.calls.handler.WithLabelValues(actor, "failed")
	return func(ctx context.Context, m *node.Message) (proto.Message, error) {
		start := time.Now()
		reply, err := h(ctx, m)
		if err != nil {
			failed.Observe(time.Since(start).Seconds())
		} else {
			ok.Observe(time.Since(start).Seconds())
		}
		return reply, err
	}
}

// Describe sends every family's descriptor.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d.d
	}
	c.calls.ask.Describe(ch)
	c.calls.handler.Describe(ch)
}

// Collect reads the source's snapshots.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	emit := func(d *desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d.d, d.typ, v, labels...)
	}

	byState := map[string]int{}
	for _, st := range []mesh.State{mesh.StateAlive, mesh.StateSuspect, mesh.StateDead, mesh.StateLeft} {
		byState[st.String()] = 0
	}
	members := c.src.Members()
	for _, m := range members {
		byState[m.State.String()]++
	}
	for st, n := range byState {
		emit(dMembers, float64(n), st)
	}

	ns := c.src.Stats()
	emit(dTell, float64(ns.TellSent), "sent")
	emit(dTell, float64(ns.TellFailed), "failed")
	emit(dAsk, float64(ns.AskOK), "ok")
	emit(dAsk, float64(ns.AskFailed), "failed")
	emit(dReliable, float64(ns.ReliableDelivered), "direct")
	emit(dReliable, float64(ns.ReliableQueued), "queued")
	emit(dReliable, float64(ns.ReliableFailed), "failed")
	emit(dRefusedFull, float64(ns.RefusedFull))
	emit(dPanics, float64(ns.Panics))
	emit(dNoSuchActor, float64(ns.NoSuchActor))
	emit(dExpiredArrival, float64(ns.Expired))
	emit(dDedupe, float64(ns.DedupeHits))
	emit(dStreamRefused, float64(ns.OutOfOrder), "out_of_order")
	emit(dStreamRefused, float64(ns.Forgotten), "forgotten")
	emit(dStreamRefused, float64(ns.Diverged), "diverged")
	emit(dStreamRefused, float64(ns.StoreFailed), "store_failed")
	emit(dActors, float64(ns.Actors))
	emit(dIdentity, float64(ns.Refused.IdentityMismatch))
	emit(dHandshakes, float64(ns.Refused.UnknownCA), "unknown_ca")
	emit(dHandshakes, float64(ns.Refused.NoCertificate), "no_certificate")
	emit(dHandshakes, float64(ns.Refused.BadCertificate), "bad_certificate")
	emit(dClaims, float64(ns.SenderMismatch))
	emit(dForgedReplies, float64(ns.ResponsesRefused))
	emit(dPeerBytesLimit, float64(ns.RefusedPeerBytes))
	emit(dFwdRefused, float64(ns.Forward.Refused))
	fw := ns.Forward
	for event, v := range map[string]uint64{"sent": fw.Sent, "unsigned_receipt": fw.Unsigned, "bad_receipt": fw.BadReceipts,
		"carried": fw.Carried, "not_carried": fw.NotCarried, "accepted": fw.Accepted} {
		emit(dForwarded, float64(v), event)
	}

	os := c.src.OutboxStats()
	emit(dOutboxDepth, float64(os.Depth))
	emit(dOutboxOldest, os.OldestAge.Seconds())
	emit(dOutboxInFlight, float64(os.InFlight))
	emit(dDLQDepth, float64(os.DLQDepth))
	emit(dRetries, float64(os.Retries))
	emit(dDeadLettered, float64(os.DeadLettered))
	emit(dExpired, float64(os.Expired))
	emit(dDelivered, float64(os.Delivered))
	emit(dEnqueued, float64(os.Enqueued))
	emit(dCoalesced, float64(os.Coalesced))
	emit(dCommits, float64(os.Fsyncs))
	emit(dCommitFails, float64(os.CommitFailures))
	failed := 0.0
	if os.Failure != "" {
		failed = 1
	}
	emit(dOutboxFailed, failed)
	emit(dRestores, float64(os.Restores))
	emit(dForgotten, float64(os.StreamsForgotten))

	ps := c.src.PeerStats()
	conns := 0
	for _, v := range ps {
		if v.Connected {
			conns++
		}
	}
	emit(dConns, float64(conns))
	emit(dGossip, float64(ns.Gossip.Sent), "sent")
	emit(dGossip, float64(ns.Gossip.Received), "received")
	for _, p := range c.peerSet(members, os, ps) {
		emit(dPeerDepth, float64(os.DepthByPeer[p]), p)
		emit(dPeerLimit, float64(os.LimitByPeer[p]), p)
		v := ps[p]
		emit(dPeerFrames, float64(v.FramesIn), p, "in")
		emit(dPeerFrames, float64(v.FramesOut), p, "out")
		emit(dPeerBytes, float64(v.BytesIn), p, "in")
		emit(dPeerBytes, float64(v.BytesOut), p, "out")
		emit(dPeerWrites, float64(v.WritesOut), p)
	}

	for _, a := range c.src.ActorStats() {
		if a.Depth == 0 && a.Rejected+a.DroppedOldest+a.DroppedNewest+a.DroppedClosed == 0 {
			continue // idle and never full: 100k such actors would flood every scrape
		}
		emit(dMailboxDepth, float64(a.Depth), a.Name)
		emit(dMailboxDrops, float64(a.Rejected), a.Name, "rejected")
		emit(dMailboxDrops, float64(a.DroppedOldest), a.Name, "drop-oldest")
		emit(dMailboxDrops, float64(a.DroppedNewest), a.Name, "drop-newest")
		emit(dMailboxDrops, float64(a.DroppedClosed), a.Name, "closed")
	}

	c.calls.ask.Collect(ch)
	c.calls.handler.Collect(ch)
}

// peerSet returns every peer seen so far (members other than this node,
// outbox destinations, transport peers), sorted; the set only grows.
func (c *Collector) peerSet(members []mesh.Member, os node.OutboxStats, ps map[string]transport.PeerStats) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	self := c.src.Name()
	for _, m := range members {
		if m.Name != self {
			c.peers[m.Name] = true
		}
	}
	for p := range os.DepthByPeer {
		c.peers[p] = true
	}
	for p := range os.LimitByPeer {
		c.peers[p] = true
	}
	for p := range ps {
		c.peers[p] = true
	}
	delete(c.peers, self)
	out := make([]string, 0, len(c.peers))
	for p := range c.peers {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

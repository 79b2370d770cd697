package mesh

import (
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"sync"
	"time"
)

// dispatch owns published: it turns view changes into events, serially.
func (m *Mesh) dispatch() {
	defer m.wg.Done()
	// published is what subscribers were last told; owned by dispatch.
	published := make(map[string]Member)
	// inPeers: a member the peers file lists (known, not self, not Left).
	inPeers := func(mem Member, known bool) bool {
		return known && mem.Name != m.cfg.NodeName && mem.State != StateLeft
	}
	for {
		select {
		case <-m.done:
			return
		case <-m.notify:
		}
		// Only the members written since the last pass: O(changes), not
		// O(members), per pass.
		cur, gone := m.takeChanged()
		peersChanged := false
		for _, mem := range cur {
			if mem.Name == m.cfg.NodeName {
				continue // no events about ourselves
			}
			prev, known := published[mem.Name]
			published[mem.Name] = mem
			if inPeers(prev, known) != inPeers(mem, true) || (known && prev.GossipAddr != mem.GossipAddr) {
				peersChanged = true
			}
			kind, ok := diff(prev, known, mem)
			if ok && m.cfg.OnEvent != nil {
				m.emit(Event{Kind: kind, Member: mem})
			}
			select {
			case <-m.done:
				return
			default:
			}
		}
		for _, name := range gone {
			// Forgotten after ReconnectTimeout: no event.
			if prev, known := published[name]; known {
				peersChanged = peersChanged || inPeers(prev, true)
				delete(published, name)
			}
		}
		if peersChanged {
			m.peersDirty.Store(true)
		}
	}
}

// emit calls OnEvent; a panic in user code is logged, not fatal to the mesh.
func (m *Mesh) emit(ev Event) {
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("mesh: OnEvent panicked", "event", ev.Kind.String(), "member", ev.Member.Name, "panic", r)
		}
	}()
	m.cfg.OnEvent(ev)
}

// rememberedPeers is what peers.json holds: every member but self and those
// that left.
func (m *Mesh) rememberedPeers() []peerRecord {
	var out []peerRecord
	for _, p := range m.Members() {
		if p.Name != m.cfg.NodeName && p.State != StateLeft {
			out = append(out, peerRecord{Name: p.Name, Addr: p.GossipAddr})
		}
	}
	return out
}

// reconnect is the serf-like loop: it writes peers.json when dirty, forgets
// old failures, and re-joins seeds and failed peers that are not members,
// which is also what merges the halves of a healed partition. The Joins run
// on a goroutine of their own: each may take up to TCPTimeout, and a round
// of them must not hold up the next round's suspicion expiry and
// peers.json. A round whose Joins find the previous round's still running
// leaves them to the next.
func (m *Mesh) reconnect() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.ReconnectInterval)
	defer t.Stop()
	probe := time.NewTicker(m.cfg.ProbeInterval) // re-probes of Suspect members
	defer probe.Stop()
	joins := make(chan []string) // unbuffered: a send succeeds only when the joiner is idle
	var joiner sync.WaitGroup
	defer joiner.Wait()
	joiner.Go(func() { m.joinLoop(joins) })
	prev := time.Now() // when the previous round began
	for {
		select {
		case <-m.done:
			return
		case now := <-probe.C:
			m.reprobeSuspects(now)
			continue
		case <-t.C:
		}
		now := time.Now()
		m.expireSuspicions(now)
		if m.peersDirty.Swap(false) {
			if err := savePeers(m.cfg.DataDir, m.rememberedPeers()); err != nil {
				m.log.Warn("mesh: cannot persist peers", "err", err)
				m.peersDirty.Store(true)
			}
		}
		targets := m.reconnectTargets(prev, now)
		prev = now
		if len(targets) > 0 {
			select {
			case joins <- targets:
			default: // still joining the previous round's
			}
		}
	}
}

// joinLoop joins each batch of addresses reconnect hands it, until the
// mesh closes.
func (m *Mesh) joinLoop(joins <-chan []string) {
	for {
		var targets []string
		select {
		case <-m.done:
			return
		case targets = <-joins:
		}
		for _, addr := range targets {
			select {
			case <-m.done:
				return
			default:
			}
			// One address per Join so shutdown waits at most one TCPTimeout.
			if _, err := m.ml.Join([]string{addr}); err != nil {
				m.log.Debug("mesh: reconnect failed", "addr", addr, "err", err)
			} else {
				m.log.Debug("mesh: reconnected", "addr", addr)
			}
		}
	}
}

// reconnectFanout is how many Joins the cluster as a whole aims at each
// failed member per ReconnectInterval.
const reconnectFanout = 2

// reconnectRetries is how many retries follow a failure: 1, 2, 4, ... 32
// ReconnectIntervals after it.
const reconnectRetries = 6

// retryFanout is about how many members of the cluster retry a failed
// member at each of those times: each member that sees the failure takes
// each retry with probability retryFanout/(reachable members), so a
// cluster of retryFanout or fewer retries from every member.
const retryFanout = 8

// reconnectTargets prunes members failed or left longer than
// ReconnectTimeout and returns the gossip addresses worth a Join in the
// round that began at now (the previous one began at prev).
//
// Seeds and the new address of a restarted member are always tried. A
// member that failed is retried 1, 2, 4, ... 32 rounds after it failed, by
// about retryFanout members at each of those times: a false death (a member
// too busy to answer probes for a moment) is repaired fastest by a Join
// from a member that holds it, since the push/pull tells the member it was
// declared dead and it refutes, and one such Join is enough. Apart from
// those, and for peers.json entries, each round tries each with
// probability reconnectFanout/(reachable members), as serf does: one healed
// link needs only one Join. Were every member to dial every failed one, a
// fleet of n with d devices offline would make n×d dials a round (3,600/s
// at 200 members with 19 offline, a sixth of the process's CPU in the fleet
// scenario) instead of about reconnectFanout×d, and a wave of d deaths
// would bring 6×n×d retries (22,700 for 19 at 200, a third of them in the
// first two rounds) instead of about 6×retryFanout×d.
func (m *Mesh) reconnectTargets(prev, now time.Time) []string {
	m.mu.Lock()
	pruned := false
	live := map[string]bool{m.addr: true}
	liveNames := map[string]bool{}
	for name, mem := range m.view {
		if name == m.cfg.NodeName {
			continue
		}
		if !mem.State.reachable() && now.Sub(mem.Since) > m.cfg.ReconnectTimeout {
			m.deleteLocked(name)
			delete(m.moved, name)
			pruned = true
			continue
		}
		if mem.State.reachable() {
			live[mem.GossipAddr] = true
			liveNames[name] = true
		}
	}
	reachable := float64(max(1, len(liveNames)))
	sampled := func() bool { return coin(reconnectFanout / reachable) }
	retry := func(since time.Time) bool { return m.retryDue(since, prev, now) && coin(retryFanout/reachable) }
	set := map[string]bool{}
	for _, a := range m.cfg.Join {
		if !live[a] {
			set[a] = true
		}
	}
	for _, mem := range m.view {
		if mem.State == StateDead && !live[mem.GossipAddr] && (retry(mem.Since) || sampled()) {
			set[mem.GossipAddr] = true
		}
		if a, ok := m.moved[mem.Name]; ok && !mem.State.reachable() && !live[a] {
			set[a] = true
		}
	}
	if now.Sub(m.startedAt) < m.cfg.ReconnectTimeout {
		for _, p := range m.filePeers {
			if p.Name != m.cfg.NodeName && !liveNames[p.Name] && !live[p.Addr] {
				if mem, ok := m.view[p.Name]; ok && mem.State == StateLeft {
					continue
				}
				if sampled() {
					set[p.Addr] = true
				}
			}
		}
	}
	m.mu.Unlock()
	if pruned {
		m.kick()
	}
	out := make([]string, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	sort.Strings(out)
	return slices.Clip(out)
}

// coin is true with probability p (always when p >= 1).
func coin(p float64) bool { return p >= 1 || rand.Float64() < p }

// retryDue reports whether one of the times 1, 2, 4, ... 32
// ReconnectIntervals after a failure at since falls in the round (prev, now].
func (m *Mesh) retryDue(since, prev, now time.Time) bool {
	for k := range reconnectRetries {
		at := since.Add(m.cfg.ReconnectInterval << k)
		if at.After(prev) && !at.After(now) {
			return true
		}
	}
	return false
}

// reprobeSuspects pings again each member that has been Suspect for more
// than a ProbeInterval, directly, once per ProbeInterval while it stays
// Suspect; an answer makes it Alive. A member is Suspect here from our own
// failed probe of it on. memberlist ends its own suspicion as soon as the
// member refutes it (gossips a newer incarnation), but tells no delegate,
// and it probes the member again only in its next round (members x
// ProbeInterval: 50 s at 200), so without this the member stayed Suspect
// here until expireSuspicions' timeout: a restarted member, probed while
// its join's gossip kept two shared cores busy, was Suspect at one of 200
// members for 2.9 s. Only the members whose probe of it failed hold a
// member Suspect, so a wave of deaths costs a few pings per death. Close
// and Kill wait for the re-probes in flight: at most ProbeTimeout, since
// memberlist's Ping cannot be cancelled.
func (m *Mesh) reprobeSuspects(now time.Time) {
	select {
	case <-m.done:
		return // shutting down: start no ping that Close would wait for
	default:
	}
	type target struct{ name, addr string }
	var due []target
	m.mu.Lock()
	for name, mem := range m.view {
		if _, busy := m.reprobing[name]; !busy && mem.State == StateSuspect && now.Sub(mem.Since) > m.cfg.ProbeInterval {
			m.reprobing[name] = struct{}{}
			due = append(due, target{name, mem.GossipAddr})
		}
	}
	m.mu.Unlock()
	for _, t := range due {
		m.wg.Go(func() { m.reprobe(t.name, t.addr) })
	}
}

// reprobe pings name at addr (waiting up to ProbeTimeout) and makes it
// Alive if it answers while still Suspect.
func (m *Mesh) reprobe(name, addr string) {
	defer func() {
		m.mu.Lock()
		delete(m.reprobing, name)
		m.mu.Unlock()
	}()
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return
	}
	if _, err := m.ml.Ping(name, ua); err == nil {
		m.clearSuspect(name)
	}
}

// expireSuspicions ends a Suspect state that outlived memberlist's longest
// suspicion timeout: memberlist would have declared the member dead by then,
// so it must have accepted a refutation. Without this, a suspicion would
// only end at our next probe of the member, one full probe round
// (members x ProbeInterval: a minute at 200 members) later.
func (m *Mesh) expireSuspicions(now time.Time) {
	m.mu.Lock()
	limit := m.cfg.maxSuspicion(len(m.view)) + m.cfg.ProbeInterval
	changed := false
	for name, mem := range m.view {
		if mem.State == StateSuspect && now.Sub(mem.Since) > limit {
			mem.State = StateAlive
			mem.Since = now
			m.setLocked(name, mem)
			changed = true
		}
	}
	m.mu.Unlock()
	if changed {
		m.kick()
	}
}

package mesh

import (
	"slices"
	"sort"
)

// HasFeature reports whether name is a member that advertises feature in
// its metadata (NodeMeta.features).
func (m *Mesh) HasFeature(name, feature string) bool {
	m.mu.RLock()
	mem, ok := m.view[name]
	m.mu.RUnlock()
	return ok && slices.Contains(mem.Features, feature)
}

// AliveWithFeature returns, sorted, the members that are Alive or Suspect
// and advertise feature, except those named in except. It takes only a
// read lock and copies no member.
func (m *Mesh) AliveWithFeature(feature string, except ...string) []string {
	var out []string
	m.mu.RLock()
	for name, mem := range m.view {
		if mem.State.reachable() && slices.Contains(mem.Features, feature) && !slices.Contains(except, name) {
			out = append(out, name)
		}
	}
	m.mu.RUnlock()
	sort.Strings(out)
	return out
}

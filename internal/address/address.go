// Package address splits "actor@node" strings: the one place that knows
// the form. node (which owns the public Address type and its validation),
// outbox and partition all split addresses here.
package address

import "strings"

// Split cuts s at its last '@' into actor and node; ok is false when s has
// no '@' (then actor is s). A valid address has no '@' in either part, so
// the last and the first are the same; the last keeps a malformed one's
// node part free of '@'.
func Split(s string) (actor, node string, ok bool) {
	i := strings.LastIndexByte(s, '@')
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// Node returns the node part of s ("" without one).
func Node(s string) string {
	_, n, _ := Split(s)
	return n
}

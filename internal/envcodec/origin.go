package envcodec

import "google.golang.org/protobuf/encoding/protowire"

// envOrigin is the number of Envelope.origin, and the Origin fields that
// say whose it is (its node, outbox id and certificate; the fourth, its
// signature, is the envelope's own).
const (
	envOrigin          protowire.Number = 21
	originLastIdentity protowire.Number = 3
)

// CutOrigin says where in env, an envelope's encoding, its origin's
// identity is: the node, outbox id and certificate fields that open its
// one origin field, as proto writes them. The origin field runs from at
// to end (its tag, its length, its fields), the identity from from to to
// within it; the same envelope whose origin says none of the three is
// env[:at], the origin's tag, its length less to-from, env[to:]. ok is
// false, and nothing else set, when env has no origin or more than one,
// when its origin does not open with those fields, each once and in
// order, the certificate at least, or has one of them again after them,
// and for bytes that do not parse.
func CutOrigin(env []byte) (at, from, to, end int, ok bool) {
	at = -1
	for p := 0; p < len(env); {
		num, typ, n := protowire.ConsumeTag(env[p:])
		if n < 0 {
			return 0, 0, 0, 0, false
		}
		m := protowire.ConsumeFieldValue(num, typ, env[p+n:])
		if m < 0 {
			return 0, 0, 0, 0, false
		}
		if num == envOrigin {
			if at >= 0 || typ != protowire.BytesType {
				return 0, 0, 0, 0, false
			}
			at, end = p, p+n+m
		}
		p += n + m
	}
	if at < 0 {
		return 0, 0, 0, 0, false
	}
	_, _, n := protowire.ConsumeTag(env[at:])
	_, l := protowire.ConsumeVarint(env[at+n:])
	from = at + n + l
	to = from
	last := protowire.Number(0)
	for p := from; p < end; {
		num, typ, k := protowire.ConsumeTag(env[p:end])
		if k < 0 {
			return 0, 0, 0, 0, false
		}
		m := protowire.ConsumeFieldValue(num, typ, env[p+k:end])
		if m < 0 {
			return 0, 0, 0, 0, false
		}
		if num <= originLastIdentity {
			// One of the three: in order, each once, before anything else.
			if to != p || num <= last || typ != protowire.BytesType || k != 1 {
				return 0, 0, 0, 0, false
			}
			last, to = num, p+k+m
		}
		p += k + m
	}
	if last != originLastIdentity {
		// No certificate: nothing a receiver could check it by, and
		// nothing to name (a receiver refuses such a name).
		return 0, 0, 0, 0, false
	}
	return at, from, to, end, true
}

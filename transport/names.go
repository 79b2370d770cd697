package transport

import (
	"fmt"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Body types, routes and origins named once per lane stream, and
// receipts' signers once per control stream.
//
// An envelope's body is a google.protobuf.Any: its type URL
// ("type.googleapis.com/google.protobuf.BytesValue", 48 bytes with its
// tag and length) goes with every message, a fifth of a tell of 128
// bytes, and quic-go's cost follows the bytes. A lane stream carries its
// frames in order, so a sender may name a type once on it (a TypeName
// frame: ref → URL) and send each later envelope of that type with a body
// that says no type and a Frame.body_type of ref; the receiver puts the
// URL back before anything else sees the envelope. Refs go from 1 up,
// each named once, at most maxNames per stream and maxNameBytes of URLs;
// a type past either is sent in full, as to a peer whose Hello does not
// list FeatureTypeNames (an older one). A receiver
// closes the connection on a ref it was not given, a ref named twice or
// out of order, a name past the bounds, or a named envelope whose body is
// missing or carries a type of its own: it is a peer's bug or its attack,
// and nothing of it could be trusted.
//
// Routes are named the same way: every message from one sender to one
// recipient carries both names (an actor's and its node's, 15 bytes in
// the benchmarks, easily 50 in a fleet), so a sender may name the pair
// once on a stream (a RouteName frame: ref → sender, recipient, whose
// fields have their Envelope numbers, so the sender copies an envelope's
// two fields as they are) and send each later envelope of that pair
// without either and with a Frame.route of ref. The rules are the type
// names' rules, with their own bounds (maxRoutes, maxRouteBytes) and Hello
// feature (FeatureRouteNames); a routed envelope that carries a sender or
// a recipient of its own closes the connection.
//
// A forwarded envelope's origin is named the same way: its node, outbox
// id and certificate (an OriginName frame, whose fields have their Origin
// numbers) are the same for every envelope of one origin, and the
// certificate alone is larger than most messages; an envelope then
// carries only its signature in its origin, and a Frame.origin of ref.
// Forwarded envelopes take proto's encoding, so the lane finds their
// origin itself (envcodec.CutOrigin) in an envelope that comes without a
// Body. Bounds: maxOrigins, maxOriginBytes; feature: FeatureOriginNames.
//
// Receipts for forwarded messages are signed (transport.SignReceipt), and
// the signature carries its signer's node and certificate: most of such a
// receipt, on each leg back to the origin. The control stream carries its
// frames in order too, so a node whose peer's Hello lists
// FeatureSignerNames names a signer once on it (a SignerName frame, whose
// fields have their ReceiptSignature numbers) and sends each later
// receipt of that signer with a signature of the signature alone and a
// Frame.signer of ref. Bounds: maxSigners, maxSignerBytes. A receipt that
// names a signer and says a node or a certificate of its own, or has no
// signature, closes the connection, as a bad name does.
//
// Every envelope the codec writes takes names: those a sender encodes
// itself (SendEncoded with a Body) and those of Send, Request and
// RequestBatch (asks, replies, the outbox's emissions), a run of them
// named under one hold of the lane lock (pushEnvelopes). Envelopes the
// codec leaves to proto (forwarded ones, with their origin) go in full,
// but for their origin's name.

// FeatureTypeNames is the Hello feature of a node that reads named body
// types on its lane streams.
const FeatureTypeNames = "type-names"

// FeatureRouteNames is the Hello feature of a node that reads named
// routes on its lane streams.
const FeatureRouteNames = "route-names"

// FeatureOriginNames is the Hello feature of a node that reads named
// origins on its lane streams.
const FeatureOriginNames = "origin-names"

// FeatureSignerNames is the Hello feature of a node that reads named
// receipt signers on its control stream.
const FeatureSignerNames = "signer-names"

// A stream's names are bounded so that what a peer makes a node hold for
// them stays small beside its stream's read buffer (16 KiB): on the most
// streams a connection takes (528), 2 MiB of URLs, 2 MiB of routes and
// 5 MiB of origins; and 8 KiB of signers on its one control stream.
const (
	maxNames       = 64      // types named on one lane stream
	maxNameBytes   = 4 << 10 // bytes of the URLs named on one lane stream
	maxRoutes      = 64      // routes named on one lane stream
	maxRouteBytes  = 4 << 10 // bytes of the senders and recipients named on one lane stream
	maxOrigins     = 16      // origins named on one lane stream
	maxOriginBytes = 8 << 10 // bytes of the origins named on one lane stream (their certificates, mostly)
	maxSigners     = 16      // receipt signers named on one control stream
	maxSignerBytes = 8 << 10 // bytes of the signers named on one control stream (their certificates, mostly)
)

// Field numbers of pb.Frame, pb.TypeName, pb.RouteName, pb.OriginName,
// pb.SignerName, pb.ReceiptSignature and pb.Envelope, for the
// hand-written frames.
const (
	frameFieldTypeName   protowire.Number = 5
	frameFieldBodyType   protowire.Number = 6
	frameFieldRouteName  protowire.Number = 7
	frameFieldRoute      protowire.Number = 8
	frameFieldOriginName protowire.Number = 9
	frameFieldOrigin     protowire.Number = 10
	frameFieldSignerName protowire.Number = 11
	frameFieldSigner     protowire.Number = 12
	originNameFieldRef   protowire.Number = 5
	signerNameFieldRef   protowire.Number = 4
	signatureFieldNode   protowire.Number = 1
	signatureFieldCert   protowire.Number = 2
	typeNameFieldRef     protowire.Number = 1
	typeNameFieldURL     protowire.Number = 2
	routeNameFieldRef    protowire.Number = 1
	envFieldOrigin       protowire.Number = 21
)

// Body says where the body of an encoded envelope is, and its type, for
// SendEncoded to name the type. Only the encoder that wrote the envelope
// makes one (envcodec.Route.Append, for the bytes it returned); the zero
// Body sends the bytes as they are.
type Body = envcodec.Body

// encodedEnv is one envelope of a run pushEnvelopes queues: encoded in
// the run's buffer at [from, to), with where its body and route are (the
// zero Body: sent as it is). pushEnvelopes fills the rest, under the lane
// lock. It is kept small, and the calls that fill and write it shallow:
// a run of one lives in the frame of a sender's deepest call, a mailbox
// goroutine's when it replies, whose stack must not grow for it.
type encodedEnv struct {
	from, to int
	body     Body

	ref         uint32 // the body type's ref on the stream; 0: its type in full
	route       uint32 // the route's ref on the stream; 0: sender and recipient in full
	origin      uint32 // the origin's ref on the stream; 0: its origin in full
	fresh       bool   // ref is named by this frame's run, before it
	routeFresh  bool   // route is named by this frame's run, before it
	originFresh bool   // origin is named by this frame's run, before it
	// Where in the envelope the parts left out are, from its first byte:
	// its route's fields [rFrom, rTo) (envcodec.CutRoute), and its body's
	// type URL, from the end of the body's head to the start of its tail
	// (envcodec.CutTypeURL), whose body is bodyLen bytes without it; or,
	// in an envelope the codec left to proto, which names neither, its
	// origin field's tag and length [headEnd, rFrom) and its identity
	// [rFrom, rTo) (envcodec.CutOrigin), the field ending at tailAt.
	rFrom, rTo, headEnd, tailAt int32
	bodyLen                     uint32
	size                        int32 // the bytes its frames take on the stream
}

// named reports whether e names its type, its route or its origin.
func (e *encodedEnv) named() bool { return e.ref != 0 || e.route != 0 || e.origin != 0 }

// originLen is the length of the origin field's value, as it is sent
// when e names its origin.
func (e *encodedEnv) originLen() int { return int(e.tailAt - e.rTo) }

// namedEnvLen is the length of e's envelope, of n bytes in full, as it
// is sent naming what e names.
func (e *encodedEnv) namedEnvLen(n int) int {
	if e.origin != 0 {
		// The origin's tag and length, and its identity, give way to a
		// length of what is left of it.
		l := e.originLen()
		tag := protowire.SizeTag(envFieldOrigin)
		return n - int(e.tailAt-e.headEnd) + tag + protowire.SizeBytes(l)
	}
	if e.route != 0 {
		n -= int(e.rTo - e.rFrom)
	}
	if e.ref != 0 {
		n -= int(e.tailAt-e.headEnd) - protowire.SizeVarint(uint64(e.bodyLen))
	}
	return n
}

// namedInner is the length of e's frame without its length prefix, its
// envelope of n bytes in full: never more than in full (the fields it
// leaves out take at least 3 bytes each, the ref naming them at most 6).
func (e *encodedEnv) namedInner(n int) int {
	inner := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(e.namedEnvLen(n))
	if e.ref != 0 {
		inner += protowire.SizeTag(frameFieldBodyType) + protowire.SizeVarint(uint64(e.ref))
	}
	if e.route != 0 {
		inner += protowire.SizeTag(frameFieldRoute) + protowire.SizeVarint(uint64(e.route))
	}
	if e.origin != 0 {
		inner += protowire.SizeTag(frameFieldOrigin) + protowire.SizeVarint(uint64(e.origin))
	}
	return inner
}

// pushEnvelopes queues the frames of the envelopes run, encoded in enc,
// as one run: nothing of another sender between them, and all of them or
// none refused (the byte bound, a closed connection). The caller
// reserved their room (reserve); a refusal gives it back. An envelope
// whose body type, route or origin can be named on the lane's stream (the
// peer takes such names, and the stream's names are not used up) is sent
// with their refs, each named first the first time; the others go in
// full.
func (l *lane) pushEnvelopes(enc []byte, run []encodedEnv) error {
	c := l.c
	k := int64(len(run))
	l.mu.Lock()
	if l.finished != nil || c.isClosedFast() {
		l.mu.Unlock()
		c.queued.Add(-k)
		return fmt.Errorf("%w: connection to %s closed", ErrConnLost, c.peer.Name)
	}
	// The names first, then the bound, then the bytes: a refused run
	// takes its names back (a later ref must follow the last one written).
	var size int64
	named := 0
	for i := range run {
		e := &run[i]
		l.name(e, enc[e.from:e.to])
		if e.fresh {
			named++
		}
		if e.routeFresh {
			named++
		}
		if e.originFresh {
			named++
		}
		size += int64(e.size)
	}
	cur, max := c.qbytes.Add(size), int64(c.t.cfg.SendQueueBytes)
	if cur > max && cur != size {
		// Over the byte bound, unless the queue was empty: one frame up
		// to MaxFrameSize always fits (Validate keeps SendQueueBytes
		// above it).
		for i := range run {
			l.unname(&run[i], enc[run[i].from:run[i].to])
		}
		l.mu.Unlock()
		c.qbytes.Add(-size)
		c.queued.Add(-k)
		return c.full(cur-size, "bytes", cur-max)
	}
	for i := range run {
		l.appendFrameLocked(&run[i], enc[run[i].from:run[i].to])
	}
	l.n += int(k)
	l.named += named
	l.mu.Unlock()
	if cur == size {
		// The queue was empty: its wait starts now, not at the last write.
		c.progress.Store(time.Now().UnixNano())
	}
	c.noteQueue()
	l.signal()
	return nil
}

// name gives e, whose envelope is env, the refs of its body type, its
// route and its origin on the lane's stream, when the peer takes such
// names, naming each when it is new and the stream's names have room (a
// ref left 0 sends that part in full), and sizes its frames. Called with
// l.mu held.
func (l *lane) name(e *encodedEnv, env []byte) {
	e.ref, e.fresh, e.route, e.routeFresh, e.origin, e.originFresh = 0, false, 0, false, 0, false
	c := l.c
	// The peer's features first: an older peer's envelopes are not cut.
	if c.names {
		if head, bodyLen, tail, ok := envcodec.CutTypeURL(env, e.body); ok {
			e.headEnd, e.tailAt, e.bodyLen = int32(len(head)), int32(len(env)-len(tail)), uint32(bodyLen)
			l.nameType(e)
		}
	}
	if c.routes {
		if from, to, ok := envcodec.CutRoute(env, e.body); ok {
			e.rFrom, e.rTo = int32(from), int32(to)
			l.nameRoute(e, env[from:to])
		}
	}
	if c.origins && e.body == (Body{}) {
		// Left to proto by the codec: perhaps forwarded, with an origin.
		l.nameOrigin(e, env)
	}
	if !e.named() {
		inner := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(len(env))
		e.size = int32(protowire.SizeVarint(uint64(inner)) + inner)
		return
	}
	inner := e.namedInner(len(env))
	n := protowire.SizeVarint(uint64(inner)) + inner
	if e.fresh {
		n += typeNameSize(e.ref, len(e.body.TypeURL()))
	}
	if e.routeFresh {
		n += copiedNameSize(frameFieldRouteName, routeNameFieldRef, e.route, int(e.rTo-e.rFrom))
	}
	if e.originFresh {
		n += copiedNameSize(frameFieldOriginName, originNameFieldRef, e.origin, int(e.rTo-e.rFrom))
	}
	e.size = int32(n)
}

// nameOrigin gives e, whose envelope is env, the ref of its origin's
// identity (envcodec.CutOrigin), naming it when it is new and the
// stream's origins have room and its naming frame fits the peer's frame
// limit (else e keeps origin 0). An origin is known by its identity's
// bytes, which count against maxOriginBytes.
func (l *lane) nameOrigin(e *encodedEnv, env []byte) {
	at, from, to, end, ok := envcodec.CutOrigin(env)
	if !ok {
		return
	}
	id := env[from:to]
	ref := l.origins[string(id)]
	if ref == 0 {
		if len(l.origins) >= maxOrigins || l.originBytes+len(id) > maxOriginBytes {
			return
		}
		if _, inner := copiedNameSizes(frameFieldOriginName, originNameFieldRef, uint32(len(l.origins)+1), len(id)); inner > l.c.maxFrame {
			return
		}
		if l.origins == nil {
			l.origins = make(map[string]uint32)
		}
		ref = uint32(len(l.origins) + 1)
		l.origins[string(id)] = ref
		l.originBytes += len(id)
		e.originFresh = true
	}
	e.origin = ref
	e.headEnd, e.rFrom, e.rTo, e.tailAt = int32(at), int32(from), int32(to), int32(end)
}

// nameType gives e its body type's ref, naming the type when it is new
// and the stream's names have room (else e keeps ref 0).
func (l *lane) nameType(e *encodedEnv) {
	url := e.body.TypeURL()
	ref := l.names[url]
	if ref == 0 {
		if len(l.names) >= maxNames || l.nameBytes+len(url) > maxNameBytes {
			return
		}
		if _, inner := typeNameSizes(uint32(len(l.names)+1), len(url)); inner > l.c.maxFrame {
			return // its naming frame would be past the peer's frame limit
		}
		if l.names == nil {
			l.names = make(map[string]uint32)
		}
		ref = uint32(len(l.names) + 1)
		l.names[url] = ref
		l.nameBytes += len(url)
		e.fresh = true
	}
	e.ref = ref
}

// nameRoute gives e the ref of its route, whose fields are fields,
// naming the route when it is new and the stream's routes have room
// (else e keeps route 0). A route is known by its fields' bytes, which
// count against maxRouteBytes: more than the names alone, which the
// receiver counts, so a sender never names past its bound.
func (l *lane) nameRoute(e *encodedEnv, fields []byte) {
	ref := l.routes[string(fields)]
	if ref == 0 {
		if len(l.routes) >= maxRoutes || l.routeBytes+len(fields) > maxRouteBytes {
			return
		}
		if _, inner := copiedNameSizes(frameFieldRouteName, routeNameFieldRef, uint32(len(l.routes)+1), len(fields)); inner > l.c.maxFrame {
			// Its naming frame would be past the peer's frame limit (an
			// envelope of nothing but its route, at the limit).
			return
		}
		if l.routes == nil {
			l.routes = make(map[string]uint32)
		}
		ref = uint32(len(l.routes) + 1)
		l.routes[string(fields)] = ref
		l.routeBytes += len(fields)
		e.routeFresh = true
	}
	e.route = ref
}

// unname takes back the names e, whose envelope is env, gave, in a run
// that is refused. Called with l.mu held.
func (l *lane) unname(e *encodedEnv, env []byte) {
	if e.fresh {
		delete(l.names, e.body.TypeURL())
		l.nameBytes -= len(e.body.TypeURL())
	}
	if e.routeFresh {
		delete(l.routes, string(env[e.rFrom:e.rTo]))
		l.routeBytes -= int(e.rTo - e.rFrom)
	}
	if e.originFresh {
		delete(l.origins, string(env[e.rFrom:e.rTo]))
		l.originBytes -= int(e.rTo - e.rFrom)
	}
}

// appendFrameLocked appends e's frame (env its envelope), after the
// frames naming its type, route or origin when e names them new. Called
// with l.mu held.
func (l *lane) appendFrameLocked(e *encodedEnv, env []byte) {
	var hb [32]byte
	if !e.named() {
		at := l.size
		inner := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(len(env))
		h := protowire.AppendVarint(hb[:0], uint64(inner))
		h = protowire.AppendTag(h, frameFieldEnvelope, protowire.BytesType)
		l.appendLocked(protowire.AppendVarint(h, uint64(len(env))))
		l.appendLocked(env)
		l.noteLarge(at)
		return
	}
	if e.fresh {
		url := e.body.TypeURL()
		l.appendLocked(appendTypeNameHead(hb[:0], e.ref, len(url)))
		l.appendLocked([]byte(url))
	}
	if e.routeFresh {
		h := appendCopiedNameHead(hb[:0], frameFieldRouteName, routeNameFieldRef, e.route, int(e.rTo-e.rFrom))
		l.appendLocked(appendRef(h, routeNameFieldRef, e.route)) // field 1, then the envelope's 4 and 5
		l.appendLocked(env[e.rFrom:e.rTo])
	}
	if e.originFresh {
		l.appendLocked(appendCopiedNameHead(hb[:0], frameFieldOriginName, originNameFieldRef, e.origin, int(e.rTo-e.rFrom)))
		l.appendLocked(env[e.rFrom:e.rTo]) // the origin's 1 to 3, then field 5
		l.appendLocked(appendRef(hb[:0], originNameFieldRef, e.origin))
	}
	frameAt := l.size // the envelope's frame, after the frames naming its parts
	inner := e.namedInner(len(env))
	h := protowire.AppendVarint(hb[:0], uint64(inner))
	h = protowire.AppendTag(h, frameFieldEnvelope, protowire.BytesType)
	l.appendLocked(protowire.AppendVarint(h, uint64(e.namedEnvLen(len(env)))))
	if e.origin != 0 {
		// The envelope up to its origin, the origin without its identity
		// (a new length), the rest.
		l.appendLocked(env[:e.headEnd])
		o := protowire.AppendTag(hb[:0], envFieldOrigin, protowire.BytesType)
		l.appendLocked(protowire.AppendVarint(o, uint64(e.originLen())))
		l.appendLocked(env[e.rTo:])
		o = protowire.AppendTag(hb[:0], frameFieldOrigin, protowire.VarintType)
		l.appendLocked(protowire.AppendVarint(o, uint64(e.origin)))
		l.noteLarge(frameAt)
		return
	}
	// The envelope, without the parts it names: the route's fields come
	// before the body (their field numbers are lower).
	at := 0
	if e.route != 0 {
		l.appendLocked(env[:e.rFrom])
		at = int(e.rTo)
	}
	t := hb[:0]
	if e.ref != 0 {
		l.appendLocked(env[at:e.headEnd])
		l.appendLocked(protowire.AppendVarint(hb[:0], uint64(e.bodyLen)))
		at = int(e.tailAt)
		t = protowire.AppendTag(hb[:0], frameFieldBodyType, protowire.VarintType)
		t = protowire.AppendVarint(t, uint64(e.ref))
	}
	l.appendLocked(env[at:])
	if e.route != 0 {
		t = protowire.AppendTag(t, frameFieldRoute, protowire.VarintType)
		t = protowire.AppendVarint(t, uint64(e.route))
	}
	l.appendLocked(t)
	l.noteLarge(frameAt)
}

// noteLarge notes the frame appended from offset at of the lane's queue to
// its end as large, if it is. Called with l.mu held.
func (l *lane) noteLarge(at int64) {
	if isLarge(int(l.size - at)) {
		l.large = append(l.large, span{at, l.size})
	}
}

// typeNameSizes are the lengths of the TypeName naming ref, a URL of
// urlLen bytes, and of its frame without the frame's length prefix.
func typeNameSizes(ref uint32, urlLen int) (tn, inner int) {
	tn = protowire.SizeTag(typeNameFieldRef) + protowire.SizeVarint(uint64(ref)) +
		protowire.SizeTag(typeNameFieldURL) + protowire.SizeBytes(urlLen)
	return tn, protowire.SizeTag(frameFieldTypeName) + protowire.SizeBytes(tn)
}

// typeNameSize is the bytes the frame naming ref, a URL of urlLen bytes,
// takes on the stream.
func typeNameSize(ref uint32, urlLen int) int {
	_, inner := typeNameSizes(ref, urlLen)
	return protowire.SizeVarint(uint64(inner)) + inner
}

// appendTypeNameHead appends the frame naming ref, a URL of urlLen bytes,
// up to the URL's own bytes, which follow it.
func appendTypeNameHead(b []byte, ref uint32, urlLen int) []byte {
	tn, inner := typeNameSizes(ref, urlLen)
	b = protowire.AppendVarint(b, uint64(inner))
	b = protowire.AppendTag(b, frameFieldTypeName, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(tn))
	b = protowire.AppendTag(b, typeNameFieldRef, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(ref))
	b = protowire.AppendTag(b, typeNameFieldURL, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(urlLen))
}

// copiedNameSizes are the lengths of a frame of kind frame (a RouteName,
// an OriginName) naming ref in its field refField, with copied bytes of
// fields copied from an envelope as they are (numbered there as in the
// envelope), and of the frame without its length prefix.
func copiedNameSizes(frame, refField protowire.Number, ref uint32, copied int) (msg, inner int) {
	msg = copied + protowire.SizeTag(refField) + protowire.SizeVarint(uint64(ref))
	return msg, protowire.SizeTag(frame) + protowire.SizeBytes(msg)
}

// copiedNameSize is the bytes such a frame takes on the stream.
func copiedNameSize(frame, refField protowire.Number, ref uint32, copied int) int {
	_, inner := copiedNameSizes(frame, refField, ref, copied)
	return protowire.SizeVarint(uint64(inner)) + inner
}

// appendCopiedNameHead appends such a frame's length, tag and message
// length; its fields follow (the ref and the copied ones, in their
// numbers' order).
func appendCopiedNameHead(b []byte, frame, refField protowire.Number, ref uint32, copied int) []byte {
	msg, inner := copiedNameSizes(frame, refField, ref, copied)
	b = protowire.AppendVarint(b, uint64(inner))
	b = protowire.AppendTag(b, frame, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(msg))
}

// appendRef appends the varint field num of ref.
func appendRef(b []byte, num protowire.Number, ref uint32) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), uint64(ref))
}

// appendSignerParts appends, for a receipt whose signature says its
// signer's node and certificate, the two fields as a SignerName copies
// them and then the receipt without them; it returns where the fields
// end, or 0 (b as it was) for a receipt without both.
func appendSignerParts(b []byte, rc *pb.Receipt) ([]byte, int) {
	s := rc.GetSignature()
	if s.GetNode() == "" || len(s.GetCertificate()) == 0 {
		return b, 0
	}
	start := len(b)
	b = protowire.AppendString(protowire.AppendTag(b, signatureFieldNode, protowire.BytesType), s.GetNode())
	b = protowire.AppendBytes(protowire.AppendTag(b, signatureFieldCert, protowire.BytesType), s.GetCertificate())
	idEnd := len(b)
	cut := proto.CloneOf(rc)
	cut.Signature.Node, cut.Signature.Certificate = "", nil
	b, err := proto.MarshalOptions{}.MarshalAppend(b, cut)
	if err != nil {
		return b[:start], 0
	}
	return b, idEnd
}

// appendSignedLocked appends a signed receipt: b[:full] is its frame,
// b[full:idEnd] its signer's identity and b[idEnd:] the receipt without
// it (appendSignerParts). It names the signer when it is new and the
// stream's signers have room and the naming frame fits the peer's frame
// limit, and then appends the receipt with its signer's ref; a signer not
// named goes in full. It returns the bytes appended.
func (l *lane) appendSignedLocked(b []byte, full, idEnd int) int {
	id, cut := b[full:idEnd], b[idEnd:]
	ref, size := l.signers[string(id)], 0
	var hb [16]byte
	if ref == 0 {
		next := uint32(len(l.signers) + 1)
		if _, inner := copiedNameSizes(frameFieldSignerName, signerNameFieldRef, next, len(id)); len(l.signers) >= maxSigners ||
			l.signerBytes+len(id) > maxSignerBytes || inner > l.c.maxFrame {
			l.appendLocked(b[:full])
			return full
		}
		if l.signers == nil {
			l.signers = make(map[string]uint32)
		}
		ref = next
		l.signers[string(id)] = ref
		l.signerBytes += len(id)
		head := appendCopiedNameHead(hb[:0], frameFieldSignerName, signerNameFieldRef, ref, len(id))
		l.appendLocked(head)
		l.appendLocked(id)
		tail := appendRef(hb[:0], signerNameFieldRef, ref)
		l.appendLocked(tail)
		l.named++
		size = copiedNameSize(frameFieldSignerName, signerNameFieldRef, ref, len(id))
	}
	inner := protowire.SizeTag(frameFieldReceipt) + protowire.SizeBytes(len(cut)) +
		protowire.SizeTag(frameFieldSigner) + protowire.SizeVarint(uint64(ref))
	head := protowire.AppendVarint(hb[:0], uint64(inner))
	head = protowire.AppendTag(head, frameFieldReceipt, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(len(cut)))
	l.appendLocked(head)
	l.appendLocked(cut)
	l.appendLocked(appendRef(hb[:0], frameFieldSigner, ref))
	return size + protowire.SizeVarint(uint64(inner)) + inner
}

// names is what a received stream named: its reader's own.
type names struct {
	urls    []string               // ref i+1 names urls[i]
	bytes   int                    // their length together
	routes  []route                // ref i+1 names routes[i]
	rbytes  int                    // their names' length together
	origins []*pb.Origin           // ref i+1 names origins[i]'s node, outbox id and certificate
	obytes  int                    // their length together
	signers []*pb.ReceiptSignature // on a control stream: ref i+1 names signers[i]'s node and certificate
	sbytes  int                    // their length together
}

// route is a sender and a recipient named on a lane stream.
type route struct{ sender, recipient string }

// take applies a frame read from a lane stream (readEnvelopeFrame's
// results) to the stream's names: it returns the envelope with its body's
// type, sender and recipient, nil for a frame that named a type or a
// route, or why the frame is bad.
func (ns *names) take(env *pb.Envelope, refs frameRefs, other any) (*pb.Envelope, error) {
	switch k := other.(type) {
	case *pb.Frame_TypeName:
		return nil, ns.add(k.TypeName)
	case *pb.Frame_RouteName:
		return nil, ns.addRoute(k.RouteName)
	case *pb.Frame_OriginName:
		return nil, ns.addOrigin(k.OriginName)
	}
	if env == nil {
		return nil, fmt.Errorf("unexpected %T on a lane stream", other)
	}
	if refs.bodyType != 0 {
		if err := ns.apply(env, refs.bodyType); err != nil {
			return nil, err
		}
	}
	if refs.route != 0 {
		if err := ns.applyRoute(env, refs.route); err != nil {
			return nil, err
		}
	}
	if refs.origin != 0 {
		if err := ns.applyOrigin(env, refs.origin); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// addOrigin takes an OriginName frame: the next ref, an origin with a
// certificate within the bounds.
func (ns *names) addOrigin(on *pb.OriginName) error {
	n := len(on.GetNode()) + len(on.GetOutboxId()) + len(on.GetCertificate())
	switch ref := on.GetRef(); {
	case int(ref) != len(ns.origins)+1:
		return fmt.Errorf("origin name ref %d where %d was next", ref, len(ns.origins)+1)
	case len(ns.origins) >= maxOrigins:
		return fmt.Errorf("more than %d origin names on one stream", maxOrigins)
	case len(on.GetCertificate()) == 0:
		return fmt.Errorf("origin name %d without a certificate", ref)
	case ns.obytes+n > maxOriginBytes:
		return fmt.Errorf("origin names of more than %d bytes on one stream", maxOriginBytes)
	default:
		ns.origins = append(ns.origins, &pb.Origin{Node: on.GetNode(), OutboxId: on.GetOutboxId(), Certificate: on.GetCertificate()})
		ns.obytes += n
		return nil
	}
}

// within reports whether ref is one of the n refs named (1 to n). A ref
// is compared as it came, never as an int, which has 32 bits on some
// platforms.
func within(ref uint32, n int) bool { return ref >= 1 && uint64(ref) <= uint64(n) }

// addSigner takes a SignerName frame: the next ref, a node and a
// certificate within the bounds.
func (ns *names) addSigner(sn *pb.SignerName) error {
	n := len(sn.GetNode()) + len(sn.GetCertificate())
	switch ref := sn.GetRef(); {
	case int(ref) != len(ns.signers)+1:
		return fmt.Errorf("signer name ref %d where %d was next", ref, len(ns.signers)+1)
	case len(ns.signers) >= maxSigners:
		return fmt.Errorf("more than %d signer names on one stream", maxSigners)
	case sn.GetNode() == "" || len(sn.GetCertificate()) == 0:
		return fmt.Errorf("signer name %d without a node or a certificate", ref)
	case ns.sbytes+n > maxSignerBytes:
		return fmt.Errorf("signer names of more than %d bytes on one stream", maxSignerBytes)
	default:
		ns.signers = append(ns.signers, &pb.ReceiptSignature{Node: sn.GetNode(), Certificate: sn.GetCertificate()})
		ns.sbytes += n
		return nil
	}
}

// applySigner puts the node and certificate that ref names into rc's
// signature. The certificate's bytes are shared by every receipt of that
// signer: nothing writes into a receipt's signature.
func (ns *names) applySigner(rc *pb.Receipt, ref uint32) error {
	switch s := rc.GetSignature(); {
	case !within(ref, len(ns.signers)):
		return fmt.Errorf("receipt names signer %d, of %d named", ref, len(ns.signers))
	case s == nil:
		return fmt.Errorf("receipt names signer %d and has no signature", ref)
	case s.GetNode() != "" || len(s.GetCertificate()) > 0:
		return fmt.Errorf("receipt names signer %d and its signature says a node or certificate of its own", ref)
	default:
		named := ns.signers[ref-1]
		s.Node, s.Certificate = named.GetNode(), named.GetCertificate()
		return nil
	}
}

// applyOrigin puts the node, outbox id and certificate that ref names
// into env's origin. The bytes are shared by every envelope of that
// origin: nothing writes into an envelope's origin.
func (ns *names) applyOrigin(env *pb.Envelope, ref uint32) error {
	switch o := env.GetOrigin(); {
	case !within(ref, len(ns.origins)):
		return fmt.Errorf("envelope names origin %d, of %d named", ref, len(ns.origins))
	case o == nil:
		return fmt.Errorf("envelope names origin %d and has no origin", ref)
	case o.GetNode() != "" || len(o.GetOutboxId()) > 0 || len(o.GetCertificate()) > 0:
		return fmt.Errorf("envelope names origin %d and its origin says a node, outbox id or certificate of its own", ref)
	default:
		named := ns.origins[ref-1]
		o.Node, o.OutboxId, o.Certificate = named.GetNode(), named.GetOutboxId(), named.GetCertificate()
		return nil
	}
}

// add takes a TypeName frame: the next ref, a URL within the bounds.
func (ns *names) add(tn *pb.TypeName) error {
	switch ref, url := tn.GetRef(), tn.GetUrl(); {
	case int(ref) != len(ns.urls)+1:
		return fmt.Errorf("type name ref %d where %d was next", ref, len(ns.urls)+1)
	case len(ns.urls) >= maxNames:
		return fmt.Errorf("more than %d type names on one stream", maxNames)
	case url == "":
		return fmt.Errorf("empty type name %d", ref)
	case ns.bytes+len(url) > maxNameBytes:
		return fmt.Errorf("type names of more than %d bytes on one stream", maxNameBytes)
	default:
		ns.urls = append(ns.urls, url)
		ns.bytes += len(url)
		return nil
	}
}

// apply puts the type that ref names back into env's body.
func (ns *names) apply(env *pb.Envelope, ref uint32) error {
	switch b := env.GetBody(); {
	case !within(ref, len(ns.urls)):
		return fmt.Errorf("envelope names body type %d, of %d named", ref, len(ns.urls))
	case b == nil:
		return fmt.Errorf("envelope names body type %d and has no body", ref)
	case b.GetTypeUrl() != "":
		return fmt.Errorf("envelope names body type %d and its body says a type of its own", ref)
	default:
		b.TypeUrl = ns.urls[ref-1]
		return nil
	}
}

// addRoute takes a RouteName frame: the next ref, a sender and a
// recipient within the bounds.
func (ns *names) addRoute(rn *pb.RouteName) error {
	switch ref, sender, recipient := rn.GetRef(), rn.GetSender(), rn.GetRecipient(); {
	case int(ref) != len(ns.routes)+1:
		return fmt.Errorf("route name ref %d where %d was next", ref, len(ns.routes)+1)
	case len(ns.routes) >= maxRoutes:
		return fmt.Errorf("more than %d route names on one stream", maxRoutes)
	case sender == "" || recipient == "":
		return fmt.Errorf("route name %d without a sender or a recipient", ref)
	case ns.rbytes+len(sender)+len(recipient) > maxRouteBytes:
		return fmt.Errorf("route names of more than %d bytes on one stream", maxRouteBytes)
	default:
		ns.routes = append(ns.routes, route{sender: sender, recipient: recipient})
		ns.rbytes += len(sender) + len(recipient)
		return nil
	}
}

// applyRoute puts the sender and recipient that ref names into env.
func (ns *names) applyRoute(env *pb.Envelope, ref uint32) error {
	switch {
	case !within(ref, len(ns.routes)):
		return fmt.Errorf("envelope names route %d, of %d named", ref, len(ns.routes))
	case env.GetSender() != "" || env.GetRecipient() != "":
		return fmt.Errorf("envelope names route %d and carries a sender or recipient of its own", ref)
	default:
		r := &ns.routes[ref-1]
		env.Sender, env.Recipient = r.sender, r.recipient
		return nil
	}
}

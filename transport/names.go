package transport

import (
	"fmt"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
)

// Body types named once per lane stream.
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
// Every envelope the codec writes takes names: those a sender encodes
// itself (SendEncoded with a Body) and those of Send, Request and
// RequestBatch (asks, replies, the outbox's emissions), a run of them
// named under one hold of the lane lock (pushEnvelopes). Envelopes the
// codec leaves to proto (forwarded ones, with their origin) go in full.

// FeatureTypeNames is the Hello feature of a node that reads named body
// types on its lane streams.
const FeatureTypeNames = "type-names"

// A stream's names are bounded so that what a peer makes a node hold for
// them stays small beside its stream's read buffer (16 KiB): on the most
// streams a connection takes (528), 2 MiB of URLs.
const (
	maxNames     = 64      // refs named on one lane stream
	maxNameBytes = 4 << 10 // bytes of the URLs named on one lane stream
)

// Field numbers of pb.Frame and pb.TypeName, for the hand-written frames.
const (
	frameFieldTypeName protowire.Number = 5
	frameFieldBodyType protowire.Number = 6
	typeNameFieldRef   protowire.Number = 1
	typeNameFieldURL   protowire.Number = 2
)

// Body says where the body of an encoded envelope is, and its type, for
// SendEncoded to name the type. Only the encoder that wrote the envelope
// makes one (envcodec.Route.Append, for the bytes it returned); the zero
// Body sends the bytes as they are.
type Body = envcodec.Body

// encodedEnv is one envelope of a run pushEnvelopes queues: encoded in
// the run's buffer at [from, to), with where its body is (the zero Body:
// sent as it is). pushEnvelopes fills the rest, under the lane lock.
type encodedEnv struct {
	from, to int
	body     Body

	ref        uint32 // the body type's ref on the stream; 0: sent in full
	fresh      bool   // ref is named by this frame's run, before it
	head, tail []byte // the envelope around its body's type URL (envcodec.CutTypeURL)
	bodyLen    uint64
}

// frameSize is the bytes e's frame takes on the stream: with its naming
// frame when it names its type.
func (e *encodedEnv) frameSize() int {
	if e.ref == 0 {
		inner := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(e.to-e.from)
		return protowire.SizeVarint(uint64(inner)) + inner
	}
	inner := e.namedInner()
	n := protowire.SizeVarint(uint64(inner)) + inner
	if e.fresh {
		n += typeNameSize(e.ref, len(e.body.TypeURL()))
	}
	return n
}

// namedInner is the length of e's frame without its length prefix, when
// it names its type: never more than in full (the type URL field it
// leaves out takes at least 3 bytes, its body_type field 2).
func (e *encodedEnv) namedInner() int {
	envLen := len(e.head) + protowire.SizeVarint(e.bodyLen) + len(e.tail)
	return protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(envLen) +
		protowire.SizeTag(frameFieldBodyType) + protowire.SizeVarint(uint64(e.ref))
}

// pushEnvelopes queues the frames of the envelopes run, encoded in enc,
// as one run: nothing of another sender between them, and all of them or
// none refused (the byte bound, a closed connection). The caller
// reserved their room (reserve); a refusal gives it back. A body whose
// type can be named on the lane's stream (the peer takes names, and the
// stream's names are not used up) is sent with its type's ref, the type
// named first the first time; the others go in full.
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
		e.ref, e.fresh = 0, false
		if c.names {
			l.name(e, enc[e.from:e.to])
		}
		if e.fresh {
			named++
		}
		size += int64(e.frameSize())
	}
	cur, max := c.qbytes.Add(size), int64(c.t.cfg.SendQueueBytes)
	if cur > max && cur != size {
		// Over the byte bound, unless the queue was empty: one frame up
		// to MaxFrameSize always fits (Validate keeps SendQueueBytes
		// above it).
		for i := range run {
			if e := &run[i]; e.fresh {
				delete(l.names, e.body.TypeURL())
				l.nameBytes -= len(e.body.TypeURL())
			}
		}
		l.mu.Unlock()
		c.qbytes.Add(-size)
		c.queued.Add(-k)
		return c.full(cur-size, "bytes", cur-max)
	}
	for i := range run {
		l.appendFrameLocked(&run[i], enc)
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

// name gives e, whose envelope is env, its body type's ref on the lane's
// stream, naming the type when it is new and the stream's names have
// room; e keeps ref 0 (in full) otherwise. Called with l.mu held.
func (l *lane) name(e *encodedEnv, env []byte) {
	url := e.body.TypeURL()
	if url == "" {
		return
	}
	head, bodyLen, tail, ok := envcodec.CutTypeURL(env, e.body)
	if !ok {
		return
	}
	ref := l.names[url]
	if ref == 0 {
		if len(l.names) >= maxNames || l.nameBytes+len(url) > maxNameBytes {
			return
		}
		if l.names == nil {
			l.names = make(map[string]uint32)
		}
		ref = uint32(len(l.names) + 1)
		l.names[url] = ref
		l.nameBytes += len(url)
		e.fresh = true
	}
	e.ref, e.head, e.bodyLen, e.tail = ref, head, bodyLen, tail
}

// appendFrameLocked appends e's frame (enc holds its envelope), after
// the frame naming its type when e names it. Called with l.mu held.
func (l *lane) appendFrameLocked(e *encodedEnv, enc []byte) {
	var hb [32]byte
	if e.ref == 0 {
		env := enc[e.from:e.to]
		inner := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(len(env))
		h := protowire.AppendVarint(hb[:0], uint64(inner))
		h = protowire.AppendTag(h, frameFieldEnvelope, protowire.BytesType)
		l.appendLocked(protowire.AppendVarint(h, uint64(len(env))))
		l.appendLocked(env)
		if isLarge(protowire.SizeVarint(uint64(inner)) + inner) {
			l.large++
		}
		return
	}
	if e.fresh {
		url := e.body.TypeURL()
		l.appendLocked(appendTypeNameHead(hb[:0], e.ref, len(url)))
		l.appendLocked([]byte(url))
	}
	inner := e.namedInner()
	envLen := len(e.head) + protowire.SizeVarint(e.bodyLen) + len(e.tail)
	h := protowire.AppendVarint(hb[:0], uint64(inner))
	h = protowire.AppendTag(h, frameFieldEnvelope, protowire.BytesType)
	l.appendLocked(protowire.AppendVarint(h, uint64(envLen)))
	l.appendLocked(e.head)
	l.appendLocked(protowire.AppendVarint(hb[:0], e.bodyLen))
	l.appendLocked(e.tail)
	t := protowire.AppendTag(hb[:0], frameFieldBodyType, protowire.VarintType)
	l.appendLocked(protowire.AppendVarint(t, uint64(e.ref)))
	if isLarge(protowire.SizeVarint(uint64(inner)) + inner) {
		l.large++
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

// names is what a received lane stream named: its reader's own.
type names struct {
	urls  []string // ref i+1 names urls[i]
	bytes int      // their length together
}

// take applies a frame read from a lane stream (readEnvelopeFrame's
// results) to the stream's names: it returns the envelope with its body's
// type, nil for a frame that named a type, or why the frame is bad.
func (ns *names) take(env *pb.Envelope, bodyType uint32, other any) (*pb.Envelope, error) {
	if tn, ok := other.(*pb.Frame_TypeName); ok {
		return nil, ns.add(tn.TypeName)
	}
	if env == nil {
		return nil, fmt.Errorf("unexpected %T on a lane stream", other)
	}
	if bodyType != 0 {
		if err := ns.apply(env, bodyType); err != nil {
			return nil, err
		}
	}
	return env, nil
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
	case ref == 0 || int(ref) > len(ns.urls):
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

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
// Only envelopes the node encodes itself take names (SendEncoded with a
// Body); the rest, forwarded and reliable ones among them, go in full.

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

// pushNamed queues the frame of an envelope whose body's type URL url was
// cut out (head, then the body's new length bodyLen, then tail: see
// envcodec.CutTypeURL), naming url on the lane's stream first if it was
// not yet. The caller reserved the frame's room (reserve). done is false,
// with nothing queued and the room still reserved, when url cannot be
// named (the stream's names are used up, or url is too long): the caller
// sends the envelope in full.
func (l *lane) pushNamed(head []byte, bodyLen uint64, tail []byte, url string) (done bool, err error) {
	c := l.c
	l.mu.Lock()
	if l.finished != nil || c.isClosedFast() {
		l.mu.Unlock()
		c.queued.Add(-1)
		return true, fmt.Errorf("%w: connection to %s closed", ErrConnLost, c.peer.Name)
	}
	ref, fresh := l.names[url], false
	if ref == 0 {
		if len(l.names) >= maxNames || l.nameBytes+len(url) > maxNameBytes {
			l.mu.Unlock()
			return false, nil
		}
		if l.names == nil {
			l.names = make(map[string]uint32)
		}
		ref, fresh = uint32(len(l.names)+1), true
	}
	envLen := len(head) + protowire.SizeVarint(bodyLen) + len(tail)
	inner := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(envLen) +
		protowire.SizeTag(frameFieldBodyType) + protowire.SizeVarint(uint64(ref))
	if inner > c.maxFrame {
		l.mu.Unlock()
		c.queued.Add(-1)
		return true, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, inner, c.maxFrame)
	}
	var def [32]byte
	var name []byte
	if fresh {
		name = appendTypeNameHead(def[:0], ref, len(url))
	}
	size := int64(len(name) + protowire.SizeVarint(uint64(inner)) + inner)
	if fresh {
		size += int64(len(url))
	}
	cur, max := c.qbytes.Add(size), int64(c.t.cfg.SendQueueBytes)
	if cur > max && cur != size {
		l.mu.Unlock()
		c.qbytes.Add(-size)
		c.queued.Add(-1)
		return true, c.full(cur-size, "bytes", cur-max)
	}
	if fresh {
		l.names[url] = ref
		l.nameBytes += len(url)
		l.named++
		l.appendLocked(name)
		l.appendLocked([]byte(url))
	}
	var hb [32]byte
	h := protowire.AppendVarint(hb[:0], uint64(inner))
	h = protowire.AppendTag(h, frameFieldEnvelope, protowire.BytesType)
	h = protowire.AppendVarint(h, uint64(envLen))
	l.appendLocked(h)
	l.appendLocked(head)
	l.appendLocked(protowire.AppendVarint(hb[:0], bodyLen))
	l.appendLocked(tail)
	t := protowire.AppendTag(hb[:0], frameFieldBodyType, protowire.VarintType)
	l.appendLocked(protowire.AppendVarint(t, uint64(ref)))
	l.n++
	if isLarge(protowire.SizeVarint(uint64(inner)) + inner) {
		l.large++
	}
	l.mu.Unlock()
	if cur == size {
		c.progress.Store(time.Now().UnixNano())
	}
	c.noteQueue()
	l.signal()
	return true, nil
}

// appendTypeNameHead appends the frame naming ref, a URL of urlLen bytes,
// up to the URL's own bytes, which follow it.
func appendTypeNameHead(b []byte, ref uint32, urlLen int) []byte {
	tn := protowire.SizeTag(typeNameFieldRef) + protowire.SizeVarint(uint64(ref)) +
		protowire.SizeTag(typeNameFieldURL) + protowire.SizeBytes(urlLen)
	inner := protowire.SizeTag(frameFieldTypeName) + protowire.SizeBytes(tn)
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

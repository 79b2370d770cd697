package envcodec_test

import (
	"bytes"
	"reflect"
	"sort"
	"testing"
	"unsafe"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"pgregory.net/rapid"
)

// allStrings returns every string of env (copies made now) and its live values.
func allStrings(env *pb.Envelope) []string {
	s := []string{env.MsgId, env.IdempotencyKey, env.Sender, env.Recipient, env.Type, env.CoalesceKey,
		env.GetBody().GetTypeUrl(), env.GetRpc().GetService(), env.GetRpc().GetMethod(),
		env.GetRpc().GetCorrelationId(), env.GetRpc().GetReplyTo()}
	keys := make([]string, 0, len(env.Headers))
	for k := range env.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s = append(s, k, env.Headers[k])
	}
	return s
}

func overlaps(a []byte, s string) bool {
	if len(a) == 0 || len(s) == 0 {
		return false
	}
	a0 := uintptr(unsafe.Pointer(&a[0]))
	s0 := uintptr(unsafe.Pointer(unsafe.StringData(s)))
	return a0 < s0+uintptr(len(s)) && s0 < a0+uintptr(len(a))
}

// genRaw builds raw envelope bytes: fields in random order, repeated
// headers/any fields, empty lengths; only what Decode's fast path accepts
// is checked.
func genRaw(t *rapid.T) []byte {
	var b []byte
	str := func(l string) []byte { return []byte(rapid.StringN(0, 6, -1).Draw(t, l)) }
	n := rapid.IntRange(0, 14).Draw(t, "n")
	for i := 0; i < n; i++ {
		f := rapid.SampledFrom([]protowire.Number{2, 3, 4, 5, 8, 9, 9, 9, 10, 10, 11, 19, 1, 13}).Draw(t, "f")
		switch f {
		case 1, 13:
			b = protowire.AppendTag(b, f, protowire.VarintType)
			b = protowire.AppendVarint(b, rapid.Uint64().Draw(t, "v"))
		case 9:
			var e []byte
			if rapid.Bool().Draw(t, "k?") {
				e = protowire.AppendTag(e, 1, protowire.BytesType)
				e = protowire.AppendBytes(e, str("k"))
			}
			if rapid.Bool().Draw(t, "v?") {
				e = protowire.AppendTag(e, 2, protowire.BytesType)
				e = protowire.AppendBytes(e, str("hv"))
			}
			b = protowire.AppendTag(b, f, protowire.BytesType)
			b = protowire.AppendBytes(b, e)
		case 10:
			var e []byte
			for _, g := range rapid.Permutation([]protowire.Number{1, 2}).Draw(t, "anyorder") {
				if !rapid.Bool().Draw(t, "anyf?") {
					continue
				}
				e = protowire.AppendTag(e, g, protowire.BytesType)
				if g == 1 {
					e = protowire.AppendBytes(e, str("url"))
				} else {
					e = protowire.AppendBytes(e, rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(t, "val"))
				}
			}
			b = protowire.AppendTag(b, f, protowire.BytesType)
			b = protowire.AppendBytes(b, e)
		case 11:
			var e []byte
			for _, g := range rapid.Permutation([]protowire.Number{1, 2, 3, 4, 5}).Draw(t, "rpcorder") {
				if !rapid.Bool().Draw(t, "rpcf?") {
					continue
				}
				if g == 1 {
					e = protowire.AppendTag(e, g, protowire.VarintType)
					e = protowire.AppendVarint(e, 1)
					continue
				}
				e = protowire.AppendTag(e, g, protowire.BytesType)
				e = protowire.AppendBytes(e, str("rpc"))
			}
			b = protowire.AppendTag(b, f, protowire.BytesType)
			b = protowire.AppendBytes(b, e)
		default:
			b = protowire.AppendTag(b, f, protowire.BytesType)
			b = protowire.AppendBytes(b, str("s"))
		}
	}
	return b
}

func checkNoAlias(t *rapid.T, b []byte, owned bool) {
	in := bytes.Clone(b)
	env, ok := envcodec.Decode(in, owned)
	if !ok {
		return
	}
	var want pb.Envelope
	if err := proto.Unmarshal(b, &want); err != nil {
		t.Fatalf("fast path accepted what proto refuses: %v", err)
	}
	if !proto.Equal(env, &want) {
		t.Fatalf("decode differs: %v vs %v", env, &want)
	}
	before := allStrings(env)
	copies := make([]string, len(before))
	for i, s := range before {
		copies[i] = string(bytes.Clone([]byte(s)))
		if v := env.GetBody().GetValue(); overlaps(v, s) {
			t.Fatalf("owned=%v: string %q overlaps body % x", owned, s, v)
		}
	}
	if v := env.GetBody().GetValue(); len(v) > 0 {
		for i := range v {
			v[i] ^= 0xff
		}
		_ = append(v, 1, 2, 3)
	}
	if !owned {
		clear(in)
	}
	after := allStrings(env)
	for i := range copies {
		if after[i] != copies[i] {
			t.Fatalf("owned=%v: string %d changed %q -> %q", owned, i, copies[i], after[i])
		}
	}
}

func TestAliasNoStringInBody(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		b := genRaw(t)
		checkNoAlias(t, b, false)
		checkNoAlias(t, b, true)
	})
}

// An explicitly empty Any.value decodes as nil on every path, as
// proto.Unmarshal decodes it, not as an empty, non-nil slice.
func TestEmptyBodyValueDecodesAsNil(t *testing.T) {
	var a []byte
	a = protowire.AppendTag(a, 1, protowire.BytesType)
	a = protowire.AppendString(a, "u")
	a = protowire.AppendTag(a, 2, protowire.BytesType)
	a = protowire.AppendBytes(a, nil)
	b := protowire.AppendTag(nil, 10, protowire.BytesType)
	b = protowire.AppendBytes(b, a)
	env, ok := envcodec.Decode(b, false)
	if !ok {
		t.Skip("fast path refused")
	}
	var want pb.Envelope
	if err := proto.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if (env.Body.Value == nil) != (want.Body.Value == nil) {
		t.Fatalf("Body.Value nil=%v, proto.Unmarshal nil=%v (reflect.DeepEqual=%v)",
			env.Body.Value == nil, want.Body.Value == nil, reflect.DeepEqual(env.Body, want.Body))
	}
	_ = anypb.Any{}
}

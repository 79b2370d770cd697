package admin

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// SendRequest is the body of POST /v1/tell, /v1/ask and /v1/send.
type SendRequest struct {
	To        string            `json:"to"`                  // actor@node
	Body      json.RawMessage   `json:"body,omitempty"`      // any JSON: an object becomes a google.protobuf.Struct, other values a google.protobuf.Value
	Raw       []byte            `json:"raw,omitempty"`       // raw bytes (base64 in JSON), sent as google.protobuf.BytesValue
	Headers   map[string]string `json:"headers,omitempty"`   // application headers (send only)
	Key       string            `json:"key,omitempty"`       // idempotency key (send only)
	Overwrite string            `json:"overwrite,omitempty"` // coalescing key (send only)
	TTL       string            `json:"ttl,omitempty"`       // Go duration, e.g. "1h" (send only)
	Timeout   string            `json:"timeout,omitempty"`   // Go duration (ask only)
}

// DecodeSendRequest parses a request body and builds its payload. Bad
// input is an error wrapping ErrBadRequest, never a panic.
func DecodeSendRequest(data []byte) (SendRequest, proto.Message, error) {
	var r SendRequest
	if err := json.Unmarshal(data, &r); err != nil {
		return r, nil, fmt.Errorf("%w: body is not a JSON request: %w", ErrBadRequest, err)
	}
	if r.To == "" {
		return r, nil, fmt.Errorf("%w: \"to\" (actor@node) is missing", ErrBadRequest)
	}
	for what, d := range map[string]string{"ttl": r.TTL, "timeout": r.Timeout} {
		if d == "" {
			continue
		}
		if v, err := time.ParseDuration(d); err != nil || v < 0 {
			return r, nil, fmt.Errorf("%w: %s %q is not a duration like \"30s\"", ErrBadRequest, what, d)
		}
	}
	if r.Key != "" && r.Overwrite != "" {
		return r, nil, fmt.Errorf("%w: give key or overwrite, not both", ErrBadRequest)
	}
	msg, err := Payload(r.Body, r.Raw)
	return r, msg, err
}

// Payload turns a JSON body or raw bytes into the message sent: raw bytes
// become a BytesValue, a JSON object a Struct, any other JSON value a Value,
// nothing an empty Struct.
func Payload(body json.RawMessage, raw []byte) (proto.Message, error) {
	switch {
	case len(body) > 0 && raw != nil:
		return nil, fmt.Errorf("%w: give body or raw, not both", ErrBadRequest)
	case raw != nil:
		return wrapperspb.Bytes(raw), nil
	case len(body) == 0:
		return &structpb.Struct{}, nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("%w: body is not JSON: %w", ErrBadRequest, err)
	}
	if obj, ok := v.(map[string]any); ok {
		s, err := structpb.NewStruct(obj)
		if err != nil {
			return nil, fmt.Errorf("%w: body: %w", ErrBadRequest, err)
		}
		return s, nil
	}
	val, err := structpb.NewValue(v)
	if err != nil {
		return nil, fmt.Errorf("%w: body: %w", ErrBadRequest, err)
	}
	return val, nil
}

// Rendered is a payload as the API shows it: JSON for Struct and Value,
// base64 raw bytes for BytesValue, protojson for other registered types,
// and only the type URL and raw bytes for unknown ones.
type Rendered struct {
	Body json.RawMessage `json:"body,omitempty"`
	Raw  []byte          `json:"raw,omitempty"`
	Type string          `json:"body_type,omitempty"`
}

// Render shows a message (nil gives the zero Rendered).
func Render(m proto.Message) Rendered {
	if m == nil {
		return Rendered{}
	}
	r := Rendered{Type: string(m.ProtoReflect().Descriptor().FullName())}
	switch v := m.(type) {
	case *wrapperspb.BytesValue:
		r.Raw = v.GetValue()
		if r.Raw == nil {
			r.Raw = []byte{}
		}
		return r
	case *anypb.Any:
		return RenderAny(v)
	}
	b, err := protojson.Marshal(m)
	if err != nil {
		return Rendered{Type: r.Type, Raw: mustMarshal(m)}
	}
	r.Body = b
	return r
}

// RenderAny shows the payload carried in an Any.
func RenderAny(a *anypb.Any) Rendered {
	if a == nil {
		return Rendered{}
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return Rendered{Type: a.GetTypeUrl(), Raw: a.GetValue()}
	}
	return Render(m)
}

func mustMarshal(m proto.Message) []byte {
	b, _ := proto.Marshal(m)
	return b
}

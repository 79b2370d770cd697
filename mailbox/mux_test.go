package mailbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func request(tb testing.TB, service, method string, body proto.Message) *pb.Envelope {
	tb.Helper()
	env := &pb.Envelope{Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, Service: service, Method: method, CorrelationId: mailbox.NewID()}}
	if body != nil {
		a, err := anypb.New(body)
		if err != nil {
			tb.Fatal(err)
		}
		env.Body = a
	}
	return env
}

func newTestMux() *mailbox.ServeMux {
	mux := mailbox.NewServeMux()
	mailbox.HandleTyped(mux, "greeter", "hello", func(ctx context.Context, req *pb.Hello) (proto.Message, error) {
		return &pb.Hello{NodeName: "hi " + req.GetNodeName()}, nil
	})
	mux.Handle("greeter", "raw", func(ctx context.Context, env *pb.Envelope) (proto.Message, error) {
		return &pb.GoAway{Reason: env.GetRpc().GetMethod()}, nil
	})
	mux.Handle("greeter", "fail", func(ctx context.Context, env *pb.Envelope) (proto.Message, error) {
		return nil, errors.New("transient trouble")
	})
	mux.Handle("greeter", "panic", func(ctx context.Context, env *pb.Envelope) (proto.Message, error) {
		panic("boom")
	})
	return mux
}

func TestServeMux(t *testing.T) {
	mux := newTestMux()
	tests := []struct {
		name      string
		env       *pb.Envelope
		wantReply proto.Message
		wantIs    error
		wantPerm  bool
	}{
		{"typed", request(t, "greeter", "hello", &pb.Hello{NodeName: "n1"}), &pb.Hello{NodeName: "hi n1"}, nil, false},
		{"raw", request(t, "greeter", "raw", nil), &pb.GoAway{Reason: "raw"}, nil, false},
		{"handler error is not permanent", request(t, "greeter", "fail", nil), nil, nil, false},
		{"wrong body type", request(t, "greeter", "hello", &pb.GoAway{Reason: "x"}), nil, mailbox.ErrBadBody, true},
		{"no body", request(t, "greeter", "hello", nil), nil, mailbox.ErrBadBody, true},
		{"garbage body", func() *pb.Envelope {
			env := request(t, "greeter", "hello", nil)
			env.Body = &anypb.Any{TypeUrl: "type.googleapis.com/meshnode.v1.Hello", Value: []byte{0xff, 0xff, 0xff}}
			return env
		}(), nil, mailbox.ErrBadBody, true},
		{"unknown method", request(t, "greeter", "nope", nil), nil, mailbox.ErrNoHandler, true},
		{"unknown service", request(t, "other", "hello", nil), nil, mailbox.ErrNoHandler, true},
		{"no rpc meta", &pb.Envelope{}, nil, mailbox.ErrNoHandler, true},
		{"nil envelope", nil, nil, mailbox.ErrNoHandler, true},
		{"panic", request(t, "greeter", "panic", nil), nil, mailbox.ErrPanicked, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reply, err := mux.Serve(context.Background(), tt.env)
			if tt.wantReply != nil {
				if err != nil {
					t.Fatalf("Serve: %v", err)
				}
				if !proto.Equal(reply, tt.wantReply) {
					t.Fatalf("reply %v, want %v", reply, tt.wantReply)
				}
				return
			}
			if err == nil {
				t.Fatalf("Serve = %v, nil; want an error", reply)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Fatalf("error %v does not match %v", err, tt.wantIs)
			}
			if mailbox.IsPermanent(err) != tt.wantPerm {
				t.Fatalf("IsPermanent(%v) = %v, want %v", err, !tt.wantPerm, tt.wantPerm)
			}
			if tt.wantPerm && mailbox.CodeOf(err) != mailbox.Rejected {
				t.Fatalf("CodeOf = %v, want Rejected", mailbox.CodeOf(err))
			}
		})
	}
}

func TestServeMuxReplaceAndRemove(t *testing.T) {
	mux := mailbox.NewServeMux()
	h := func(reason string) mailbox.HandlerFunc {
		return func(context.Context, *pb.Envelope) (proto.Message, error) { return &pb.GoAway{Reason: reason}, nil }
	}
	mux.Handle("s", "m", h("first"))
	mux.Handle("s", "m", h("second"))
	reply, err := mux.Serve(context.Background(), request(t, "s", "m", nil))
	if err != nil || reply.(*pb.GoAway).GetReason() != "second" {
		t.Fatalf("Serve = %v, %v; want the replacing handler", reply, err)
	}
	mux.Handle("s", "m", nil)
	if _, err := mux.Serve(context.Background(), request(t, "s", "m", nil)); !errors.Is(err, mailbox.ErrNoHandler) {
		t.Fatalf("after removal: %v", err)
	}
}

func TestServeMuxPassesContext(t *testing.T) {
	type key struct{}
	mux := mailbox.NewServeMux()
	mailbox.HandleTyped(mux, "s", "m", func(ctx context.Context, req *pb.Hello) (proto.Message, error) {
		v, _ := ctx.Value(key{}).(string)
		return &pb.Hello{NodeName: v}, nil
	})
	ctx := context.WithValue(context.Background(), key{}, "ctx-value")
	reply, err := mux.Serve(ctx, request(t, "s", "m", &pb.Hello{}))
	if err != nil || reply.(*pb.Hello).GetNodeName() != "ctx-value" {
		t.Fatalf("Serve = %v, %v", reply, err)
	}
}

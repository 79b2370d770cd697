// Command protoc-gen-meshnode is a protoc plugin: for each .proto file that
// defines services it writes NAME_meshnode.pb.go, next to protoc-gen-go's
// NAME.pb.go, with typed clients and servers on a meshnode node.
//
// For a service Greeter with a method SayHello(HelloRequest) returns
// (HelloReply) it generates:
//
//	func NewGreeterClient(n *node.Node, to node.Address) *GreeterClient
//	func (c *GreeterClient) SayHello(ctx, *HelloRequest, ...node.SendOption) (*HelloReply, error)      // Ask
//	func (c *GreeterClient) SayHelloTell(ctx, *HelloRequest, ...node.SendOption) error                  // Tell
//	func (c *GreeterClient) SayHelloReliable(ctx, *HelloRequest, ...node.SendOption) (node.Outcome, error) // TellReliable
//
//	type GreeterServer interface { SayHello(context.Context, *HelloRequest) (*HelloReply, error) }
//	func RegisterGreeterServer(mux *node.ServiceMux, impl GreeterServer)
//
//	// the replies of SayHelloReliable(ctx, req, node.WithReplyTo(replies)), on the actor replies
//	type GreeterReplies interface { SayHelloReply(ctx, correlationID string, *HelloReply, error) error }
//	func RegisterGreeterReplies(mux *node.ServiceMux, impl GreeterReplies)
//
// Every message carries the service's full name and the method's name
// (RpcMeta.service and .method); node.ServiceMux routes by them and
// answers an unknown method with node.ErrUnknownMethod. Streaming methods
// are refused: every meshnode send carries one message.
//
// Usage (the Makefile's generate target):
//
//	go build -o bin/protoc-gen-meshnode ./cmd/protoc-gen-meshnode
//	protoc --plugin=protoc-gen-meshnode=bin/protoc-gen-meshnode \
//		--go_out=. --go_opt=paths=source_relative \
//		--meshnode_out=. --meshnode_opt=paths=source_relative device.proto
package main

import (
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/types/pluginpb"
)

func main() {
	protogen.Options{}.Run(func(p *protogen.Plugin) error {
		p.SupportedFeatures = uint64(pluginpb.CodeGeneratorResponse_FEATURE_PROTO3_OPTIONAL)
		for _, f := range p.Files {
			if !f.Generate || len(f.Services) == 0 {
				continue
			}
			if err := generateFile(p, f); err != nil {
				return err
			}
		}
		return nil
	})
}

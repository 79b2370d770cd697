// Package devicepb is the example's DeviceCommands service: the messages
// (device.pb.go, by protoc-gen-go) and its meshnode client, server and
// replies (device_meshnode.pb.go, by protoc-gen-meshnode), generated from
// device.proto by make generate. Do not edit the generated files.
package devicepb

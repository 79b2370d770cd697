// Package device is meshnode's example application: an operator sends
// commands to devices, some of which are offline for hours, through the
// DeviceCommands service generated from devicepb/device.proto by
// protoc-gen-meshnode (make generate).
//
// A device serves the service with an actor; the operator calls it with
// the generated client in the three sends:
//
//	// device
//	mux := node.NewServiceMux()
//	devicepb.RegisterDeviceCommandsServer(mux, dev)
//	n.Spawn("commands", mux.Serve)
//
//	// operator
//	c := devicepb.NewDeviceCommandsClient(n, node.Addr("commands", "device-1"))
//	res, err := c.Run(ctx, cmd)                       // Ask: the result or a typed error
//	err = c.RunTell(ctx, cmd)                         // Tell: at most once
//	out, err := c.RunReliable(ctx, cmd,               // TellReliable: runs once, even after hours offline;
//		node.WithReplyTo(node.Addr("replies", "operator")), // the result comes back to "replies",
//		node.WithCorrelationID(cmd.GetId()))                // matched by the command's id
//
//	// operator: "replies" hands each result to op.RunReply(ctx, id, result, err)
//	mux := node.NewServiceMux()
//	devicepb.RegisterDeviceCommandsReplies(mux, op)
//	n.Spawn("replies", mux.Serve)
//
// device_test.go runs it on three nodes, including a command sent to an
// offline device while the operator restarts.
package device

import (
	"context"
	"fmt"
	"sync"

	"github.com/meshnode/meshnode/examples/device/devicepb"
	"github.com/meshnode/meshnode/node"
)

// The actors of the example.
const (
	CommandsActor = "commands" // on each device: serves DeviceCommands
	RepliesActor  = "replies"  // on the operator: receives the results of reliable commands
)

// Device runs commands. Its record of what ran is the device's own state:
// the example keeps it in memory across its node's restarts, where a real
// device would store it (with Message.Stream and Message.Sequence, for an
// exactly-once effect across its own crashes).
type Device struct {
	Name string

	// mu guards the fields below.
	mu   sync.Mutex
	ran  []string       // command ids, in the order run
	runs map[string]int // runs per command id
}

// NewDevice returns a device that has run nothing.
func NewDevice(name string) *Device { return &Device{Name: name, runs: map[string]int{}} }

// Spawn serves DeviceCommands on n as the actor CommandsActor. Call it
// between node.Open and Node.Start, so the service is there when the
// device becomes visible.
func (d *Device) Spawn(n *node.Node) error {
	mux := node.NewServiceMux()
	devicepb.RegisterDeviceCommandsServer(mux, d)
	_, err := n.Spawn(CommandsActor, mux.Serve)
	return err
}

// Run runs a command.
func (d *Device) Run(ctx context.Context, cmd *devicepb.Command) (*devicepb.CommandResult, error) {
	if cmd.GetId() == "" || cmd.GetAction() == "" {
		return nil, node.Permanent(fmt.Errorf("device %s: a command needs an id and an action", d.Name))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ran = append(d.ran, cmd.GetId())
	d.runs[cmd.GetId()]++
	return &devicepb.CommandResult{Id: cmd.GetId(), Device: d.Name, Output: cmd.GetAction() + ": done"}, nil
}

// Status reports what the device ran.
func (d *Device) Status(ctx context.Context, _ *devicepb.StatusRequest) (*devicepb.DeviceStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &devicepb.DeviceStatus{Device: d.Name, Ran: append([]string(nil), d.ran...)}, nil
}

// Runs returns how many times the command with that id ran.
func (d *Device) Runs(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.runs[id]
}

// Operator receives the results of commands sent reliably with
// node.WithReplyTo(node.Addr(RepliesActor, ...)). Like a device's record,
// its record of results is the operator's own state.
type Operator struct {
	// mu guards the fields below.
	mu      sync.Mutex
	results map[string][]*devicepb.CommandResult // by command id
	failed  map[string]error                     // by command id: the device refused it
}

// NewOperator returns an operator that has received nothing.
func NewOperator() *Operator {
	return &Operator{results: map[string][]*devicepb.CommandResult{}, failed: map[string]error{}}
}

// Spawn starts the actor RepliesActor on n, which takes the replies of
// DeviceCommands requests (and refuses anything else as poison).
func (o *Operator) Spawn(n *node.Node) error {
	mux := node.NewServiceMux()
	devicepb.RegisterDeviceCommandsReplies(mux, o)
	_, err := n.Spawn(RepliesActor, mux.Serve)
	return err
}

// RunReply records the result of a command, or the device's refusal.
func (o *Operator) RunReply(_ context.Context, id string, res *devicepb.CommandResult, err error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		o.failed[id] = err
		return nil
	}
	o.results[id] = append(o.results[id], res)
	return nil
}

// StatusReply is not used: the operator asks for a status (Status), it
// does not request one reliably.
func (o *Operator) StatusReply(context.Context, string, *devicepb.DeviceStatus, error) error {
	return nil
}

// Results returns the results received for the command with that id (one,
// however often the command or its result was delivered).
func (o *Operator) Results(id string) []*devicepb.CommandResult {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*devicepb.CommandResult(nil), o.results[id]...)
}

// Failed returns the device's error for the command with that id, if it
// refused it.
func (o *Operator) Failed(id string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failed[id]
}

package device_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshnode/meshnode/examples/device"
	"github.com/meshnode/meshnode/examples/device/devicepb"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/node/nodetest"
)

func TestMain(m *testing.M) { testutil.VerifyTestMain(m) }

// fleet is an operator and two devices on three nodes. The Device and
// Operator values outlive their nodes' restarts: they are the
// applications' own state.
type fleet struct {
	*nodetest.Cluster
	op      *device.Operator
	devices map[string]*device.Device
}

func newFleet(t *testing.T) *fleet {
	f := &fleet{op: device.NewOperator(), devices: map[string]*device.Device{
		"device-1": device.NewDevice("device-1"),
		"device-2": device.NewDevice("device-2"),
	}}
	f.Cluster = nodetest.New(t, []string{"operator", "device-1", "device-2"},
		nodetest.WithSetup(func(n *node.Node) error {
			if d, ok := f.devices[n.Name()]; ok {
				return d.Spawn(n)
			}
			return f.op.Spawn(n)
		}))
	return f
}

func (f *fleet) client(dev string) *devicepb.DeviceCommandsClient {
	return devicepb.NewDeviceCommandsClient(f.Node("operator"), node.Addr(device.CommandsActor, dev))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestDeviceCommandsThreeSends: the generated client in its three sends,
// from the operator to two devices.
func TestDeviceCommandsThreeSends(t *testing.T) {
	f := newFleet(t)
	ctx := ctxT(t)

	res, err := f.client("device-1").Run(ctx, &devicepb.Command{Id: "c1", Action: "reboot"})
	if err != nil {
		t.Fatalf("Run (ask): %v", err)
	}
	if res.GetDevice() != "device-1" || res.GetId() != "c1" || res.GetOutput() != "reboot: done" {
		t.Fatalf("Run (ask) = %v", res)
	}

	if err := f.client("device-2").RunTell(ctx, &devicepb.Command{Id: "c2", Action: "blink"}); err != nil {
		t.Fatalf("RunTell: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "device-2 ran c2", func() bool { return f.devices["device-2"].Runs("c2") == 1 })

	out, err := f.client("device-2").RunReliable(ctx, &devicepb.Command{Id: "c3", Action: "update"},
		node.WithReplyTo(node.Addr(device.RepliesActor, "operator")), node.WithCorrelationID("c3"))
	if err != nil || out != node.Delivered {
		t.Fatalf("RunReliable = %v, %v; want Delivered", out, err)
	}
	testutil.WaitFor(t, 10*time.Second, "the result of c3 at the operator", func() bool { return len(f.op.Results("c3")) == 1 })
	if r := f.op.Results("c3")[0]; r.GetDevice() != "device-2" || r.GetOutput() != "update: done" {
		t.Fatalf("result of c3 = %v", r)
	}

	st, err := f.client("device-2").Status(ctx, &devicepb.StatusRequest{})
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if got := st.GetRan(); len(got) != 2 || got[0] != "c2" || got[1] != "c3" {
		t.Fatalf("device-2 ran %v, want [c2 c3]", got)
	}

	// A command the device refuses as poison comes back as an error, once.
	out, err = f.client("device-1").RunReliable(ctx, &devicepb.Command{Id: "bad"},
		node.WithReplyTo(node.Addr(device.RepliesActor, "operator")), node.WithCorrelationID("bad"))
	if err != nil || out != node.DeadLettered {
		t.Fatalf("RunReliable of a bad command = %v, %v; want DeadLettered", out, err)
	}
	testutil.WaitFor(t, 10*time.Second, "the refusal of the bad command", func() bool { return f.op.Failed("bad") != nil })
	if err := f.op.Failed("bad"); !node.IsPermanent(err) {
		t.Fatalf("refusal %v is not permanent", err)
	}

	// A method the device does not serve is a typed error, not a timeout.
	err = f.Node("operator").Ask(ctx, node.Addr(device.CommandsActor, "device-1"), &devicepb.Command{Id: "x", Action: "y"}, nil,
		node.WithMethod(devicepb.DeviceCommandsServiceName, "SelfDestruct"))
	var re *node.RemoteError
	if !errors.Is(err, node.ErrUnknownMethod) || !errors.As(err, &re) {
		t.Fatalf("unknown method: %v, want a *RemoteError matching ErrUnknownMethod", err)
	}
}

// TestOfflineDeviceCommand: the operator sends a command to a device that
// is offline; the operator restarts; the device comes back, runs the
// command once, and its result reaches the operator's reply actor once.
func TestOfflineDeviceCommand(t *testing.T) {
	f := newFleet(t)
	f.Kill("device-1") // offline: a crash, not a goodbye

	out, err := f.client("device-1").RunReliable(ctxT(t), &devicepb.Command{Id: "fw-42", Action: "update-firmware"},
		node.WithReplyTo(node.Addr(device.RepliesActor, "operator")), node.WithCorrelationID("fw-42"))
	if err != nil || out != node.Queued {
		t.Fatalf("RunReliable to an offline device = %v, %v; want Queued", out, err)
	}

	f.Stop("operator") // the command waits in the operator's outbox on disk
	f.Restart("operator")
	f.Restart("device-1")

	testutil.WaitFor(t, 20*time.Second, "the result of fw-42 at the operator", func() bool { return len(f.op.Results("fw-42")) > 0 })
	// Once both outboxes are empty nothing more can arrive: the counts are final.
	testutil.WaitFor(t, 20*time.Second, "both outboxes empty", func() bool {
		return f.Node("operator").Outbox().Stats().Depth == 0 && f.Node("device-1").Outbox().Stats().Depth == 0
	})
	if n := f.devices["device-1"].Runs("fw-42"); n != 1 {
		t.Fatalf("device-1 ran fw-42 %d times, want 1", n)
	}
	if res := f.op.Results("fw-42"); len(res) != 1 || res[0].GetDevice() != "device-1" {
		t.Fatalf("operator got %v for fw-42, want one result from device-1", res)
	}
}

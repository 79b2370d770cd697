package device_test

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/examples/device"
	"github.com/meshnode/meshnode/examples/device/devicepb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/node/nodetest"
)

// BenchmarkAskRoundTrip compares the generated client's Run with the same
// ask written by hand (n.Ask with WithMethod), over QUIC between two nodes
// of one process, after a warm-up. Each run of the benchmark function
// measures both, the first of them alternating from run to run, so -count
// alternates them without favouring either; compare with
//
//	go test -run '^$' -bench AskRoundTrip -count 10 ./examples/device | tee ask.txt
//	go run golang.org/x/perf/cmd/benchstat@latest -col /impl ask.txt
func BenchmarkAskRoundTrip(b *testing.B) {
	dev := device.NewDevice("device-1")
	c := nodetest.New(b, []string{"operator", "device-1"}, nodetest.WithSetup(func(n *node.Node) error {
		if n.Name() == "device-1" {
			return dev.Spawn(n)
		}
		return nil
	}))
	op, to := c.Node("operator"), node.Addr(device.CommandsActor, "device-1")
	ctx := context.Background()
	cmd := &devicepb.Command{Id: "bench", Action: "noop"}
	for range 500 { // a warm connection and warm caches for both
		if err := op.Ask(ctx, to, cmd, nil, node.WithMethod(devicepb.DeviceCommandsServiceName, "Run")); err != nil {
			b.Fatal(err)
		}
	}
	hand := func(b *testing.B) {
		method := node.WithMethod(devicepb.DeviceCommandsServiceName, "Run")
		b.ReportAllocs()
		for b.Loop() {
			var res devicepb.CommandResult
			if err := op.Ask(ctx, to, cmd, &res, method); err != nil {
				b.Fatal(err)
			}
		}
	}
	generated := func(b *testing.B) {
		client := devicepb.NewDeviceCommandsClient(op, to)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := client.Run(ctx, cmd); err != nil {
				b.Fatal(err)
			}
		}
	}
	askRuns++
	if askRuns%2 == 1 {
		b.Run("impl=hand", hand)
		b.Run("impl=generated", generated)
	} else {
		b.Run("impl=generated", generated)
		b.Run("impl=hand", hand)
	}
}

// askRuns counts runs of BenchmarkAskRoundTrip, to alternate which
// implementation goes first.
var askRuns int

// BenchmarkAskOverhead runs the hand-written ask and the generated client's
// in turn within each iteration, so both meet the same load on a shared
// machine, and reports each one's mean and the generated client's overhead
// in percent (overhead-%; benchstat summarises it over -count runs).
func BenchmarkAskOverhead(b *testing.B) {
	dev := device.NewDevice("device-1")
	c := nodetest.New(b, []string{"operator", "device-1"}, nodetest.WithSetup(func(n *node.Node) error {
		if n.Name() == "device-1" {
			return dev.Spawn(n)
		}
		return nil
	}))
	op, to := c.Node("operator"), node.Addr(device.CommandsActor, "device-1")
	ctx := context.Background()
	cmd := &devicepb.Command{Id: "bench", Action: "noop"}
	method := node.WithMethod(devicepb.DeviceCommandsServiceName, "Run")
	client := devicepb.NewDeviceCommandsClient(op, to)
	for range 500 { // a warm connection and warm caches for both
		if _, err := client.Run(ctx, cmd); err != nil {
			b.Fatal(err)
		}
	}
	var hand, generated time.Duration
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		// The first of the two alternates, so neither always follows the other.
		for k := range 2 {
			start := time.Now()
			if (i+k)%2 == 0 {
				var res devicepb.CommandResult
				if err := op.Ask(ctx, to, cmd, &res, method); err != nil {
					b.Fatal(err)
				}
				hand += time.Since(start)
			} else {
				if _, err := client.Run(ctx, cmd); err != nil {
					b.Fatal(err)
				}
				generated += time.Since(start)
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(hand.Nanoseconds())/n, "hand-ns/ask")
	b.ReportMetric(float64(generated.Nanoseconds())/n, "generated-ns/ask")
	b.ReportMetric(100*(float64(generated)-float64(hand))/float64(hand), "overhead-%")
}

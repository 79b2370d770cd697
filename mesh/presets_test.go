package mesh_test

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/mesh"
)

func TestPresetFor(t *testing.T) {
	def := mesh.DefaultConfig("n")
	for _, tc := range []struct {
		size                int
		probe, pushPull     time.Duration
		streamBytes, stream int
	}{
		{1, def.ProbeInterval, def.PushPullInterval, def.InboundStreamBytes, def.InboundStreams},
		{16, def.ProbeInterval, def.PushPullInterval, def.InboundStreamBytes, def.InboundStreams},
		{17, 250 * time.Millisecond, 10 * time.Second, 1 << 20, 32},
		{200, 250 * time.Millisecond, 10 * time.Second, 1 << 20, 32},
		{1000, time.Second, 30 * time.Second, 2 << 20, 32},
		{5000, 2 * time.Second, time.Minute, 8 << 20, 32},
		{100000, 2 * time.Second, time.Minute, 8 << 20, 32},
	} {
		c := mesh.PresetFor("n", tc.size)
		if err := c.Validate(); err != nil {
			t.Errorf("PresetFor(%d) invalid: %v", tc.size, err)
		}
		if c.ProbeInterval != tc.probe || c.PushPullInterval != tc.pushPull ||
			c.InboundStreamBytes != tc.streamBytes || c.InboundStreams != tc.stream {
			t.Errorf("PresetFor(%d) = probe %v push/pull %v bytes %d streams %d", tc.size,
				c.ProbeInterval, c.PushPullInterval, c.InboundStreamBytes, c.InboundStreams)
		}
		want := def.HandoffQueueDepth
		if tc.size > 16 {
			want = 8192
		}
		if c.HandoffQueueDepth != want {
			t.Errorf("PresetFor(%d).HandoffQueueDepth = %d, want %d", tc.size, c.HandoffQueueDepth, want)
		}
		// The fields presets do not own are DefaultConfig's.
		if c.NodeName != "n" || c.TCPTimeout != def.TCPTimeout || c.ReconnectInterval != def.ReconnectInterval {
			t.Errorf("PresetFor(%d) changed a field it does not own", tc.size)
		}
		// A full member list with the largest metadata fits one stream.
		if need := tc.size * 600; tc.size <= 8192 && need > c.InboundStreamBytes {
			t.Errorf("PresetFor(%d): a push/pull of %d bytes exceeds InboundStreamBytes %d", tc.size, need, c.InboundStreamBytes)
		}
	}
}

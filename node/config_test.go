package node_test

import (
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
)

// Validate checks the whole tree: one bad field in any embedded config is
// node.ErrBadConfig and the sub-package's own sentinel, and the message
// names the section once, with no package prefix repeated.
func TestConfigValidateSubConfigs(t *testing.T) {
	good := testConfig(t, "n1", t.TempDir())
	tests := []struct {
		name     string
		mut      func(*node.Config)
		sentinel error
		want     string // the whole message
	}{
		{"mesh", func(c *node.Config) { c.Mesh.ProbeInterval = 0 }, mesh.ErrBadConfig,
			"node: bad config: Mesh: ProbeInterval must be > 0, got 0s"},
		{"mesh bind address", func(c *node.Config) { c.GossipAddr = "localhost:0" }, mesh.ErrBadConfig,
			`node: bad config: Mesh: BindAddr "localhost:0": host "localhost" is not an IP address`},
		{"transport", func(c *node.Config) { c.Transport.Lanes = 0 }, transport.ErrBadConfig,
			"node: bad config: Transport: Lanes 0 outside [1, 256]"},
		{"outbox", func(c *node.Config) { c.Outbox.MaxBatch = 0 }, outbox.ErrBadConfig,
			"node: bad config: Outbox: MaxBatch must be >= 1"},
		{"relay", func(c *node.Config) { c.Relay.Partitions = 0 }, partition.ErrBadConfig,
			"node: bad config: Relay: Partitions must be in [1, 1024]"},
		{"responses", func(c *node.Config) { c.Responses.EarlyTTL = 0 }, mailbox.ErrBadConfig,
			"node: bad config: Responses: registry EarlyTTL 0s must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.mut(&c)
			err := c.Validate()
			if !errors.Is(err, node.ErrBadConfig) || !errors.Is(err, tt.sentinel) {
				t.Fatalf("Validate() = %v, want node.ErrBadConfig and %v", err, tt.sentinel)
			}
			if err.Error() != tt.want {
				t.Errorf("Validate() reads\n\t%s\nwant\n\t%s", err, tt.want)
			}
			_, err = node.New(c)
			if !errors.Is(err, node.ErrBadConfig) || !errors.Is(err, tt.sentinel) || err.Error() != tt.want {
				t.Errorf("New() = %v, want the error of Validate", err)
			}
		})
	}
}

// A field of an embedded config that the node sets from its own is refused
// when set to another value (it would be overwritten without a word), and
// accepted when it agrees.
func TestConfigValidateOwnedFields(t *testing.T) {
	good := testConfig(t, "n1", t.TempDir())
	other := slog.New(slog.DiscardHandler)
	tests := []struct {
		name  string
		mut   func(*node.Config)
		field string // "" = accepted
	}{
		{"mesh cluster", func(c *node.Config) { c.Mesh.Cluster = "other" }, "Mesh.Cluster is set by Cluster"},
		{"mesh cluster agrees", func(c *node.Config) { c.Mesh.Cluster = c.Cluster }, ""},
		{"mesh node name", func(c *node.Config) { c.Mesh.NodeName = "n2" }, "Mesh.NodeName is set by Name"},
		{"mesh bind address", func(c *node.Config) { c.Mesh.BindAddr = "127.0.0.1:1" }, "Mesh.BindAddr is set by GossipAddr"},
		{"mesh join", func(c *node.Config) { c.Mesh.Join = []string{"127.0.0.1:1"} }, "Mesh.Join is set by Join"},
		{"mesh key", func(c *node.Config) { c.Mesh.SecretKey = make([]byte, 32) }, "Mesh.SecretKey is set by GossipKey"},
		{"mesh data dir", func(c *node.Config) { c.Mesh.DataDir = "/elsewhere" }, "Mesh.DataDir is set by DataDir"},
		{"mesh meta", func(c *node.Config) { c.Mesh.Meta = mesh.DefaultConfig("n1").Meta }, "Mesh.Meta is set by the node"},
		{"mesh logger", func(c *node.Config) { c.Mesh.Logger = other }, "Mesh.Logger is set by Logger"},
		{"mesh logger agrees", func(c *node.Config) { c.Logger = other; c.Mesh.Logger = other }, ""},
		{"transport cluster", func(c *node.Config) { c.Transport.Cluster = "other" }, "Transport.Cluster is set by Cluster"},
		{"transport boot id", func(c *node.Config) { c.Transport.BootID = "b1" }, "Transport.BootID is set by the node"},
		{"transport outbox id", func(c *node.Config) { c.Transport.OutboxID = [16]byte{1} }, "Transport.OutboxID is set by the node"},
		{"transport listen address", func(c *node.Config) { c.Transport.ListenAddr = "127.0.0.1:1" }, "Transport.ListenAddr is set by QUICAddr"},
		{"transport identity", func(c *node.Config) { c.Transport.Identity = transport.Identity{Name: "n1"} }, "Transport.Identity is set by TLS"},
		{"transport identity agrees", func(c *node.Config) { c.Transport.Identity = c.TLS }, ""},
		{"transport data dir", func(c *node.Config) { c.Transport.DataDir = "/elsewhere" }, "Transport.DataDir is set by DataDir"},
		{"transport logger", func(c *node.Config) { c.Transport.Logger = other }, "Transport.Logger is set by Logger"},
		{"outbox path", func(c *node.Config) { c.Outbox.Path = "/elsewhere/outbox.db" }, "Outbox.Path is set by DataDir"},
		{"outbox path agrees", func(c *node.Config) { c.Outbox.Path = filepath.Join(c.DataDir, "outbox.db") }, ""},
		{"outbox logger", func(c *node.Config) { c.Outbox.Logger = other }, "Outbox.Logger is set by Logger"},
		{"relay logger", func(c *node.Config) { c.Relay.Logger = other }, "Relay.Logger is set by Logger"},
		{"responses TTL", func(c *node.Config) { c.Responses.TTL = time.Hour }, "Responses.TTL is set by AskResponseTTL"},
		{"mesh OnEvent is chained, not owned", func(c *node.Config) { c.Mesh.OnEvent = func(mesh.Event) {} }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.mut(&c)
			err := c.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, node.ErrBadConfig) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("Validate() = %v, want ErrBadConfig saying %q", err, tt.field)
			}
		})
	}
}

// DefaultConfig leaves the fields the node owns zero, so a config built
// from it passes the ownership check whatever the top-level fields say.
func TestDefaultConfigLeavesOwnedFieldsZero(t *testing.T) {
	c := node.DefaultConfig("n1")
	if c.Cluster != node.DefaultCluster || node.DefaultCluster != "meshnode" {
		t.Errorf("Cluster = %q, DefaultCluster = %q; want meshnode", c.Cluster, node.DefaultCluster)
	}
	if mesh.DefaultConfig("x").Cluster != node.DefaultCluster || transport.DefaultConfig("x").Cluster != node.DefaultCluster {
		t.Error("mesh's or transport's default cluster differs from node.DefaultCluster")
	}
	if c.Mesh.Cluster != "" || c.Mesh.BindAddr != "" || c.Mesh.Meta != nil || c.Mesh.Logger != nil || c.Mesh.NodeName != "" {
		t.Errorf("Mesh has owned fields set: %+v", c.Mesh)
	}
	if c.Transport.Cluster != "" || c.Transport.BootID != "" || c.Transport.ListenAddr != "" || c.Transport.Logger != nil || c.Transport.NodeName != "" {
		t.Error("Transport has owned fields set")
	}
	if c.Outbox.Path != "" || c.Outbox.Logger != nil || c.Relay.Logger != nil || c.Responses.TTL != 0 {
		t.Error("Outbox, Relay or Responses has owned fields set")
	}
	c.Cluster, c.Name = "elsewhere", "n9"
	c.DataDir = t.TempDir()
	id, err := testCA(t).NewIdentity("n9")
	if err != nil {
		t.Fatal(err)
	}
	c.TLS = id
	if err := c.Validate(); err != nil {
		t.Fatalf("DefaultConfig with its top-level fields changed: %v", err)
	}
}

// MeshPreset is mesh.PresetFor without the node's fields: it validates in a
// node config as it is, and 16 members is DefaultConfig's tuning.
func TestMeshPreset(t *testing.T) {
	for _, size := range []int{3, 16, 200, 1000, 5000} {
		cfg := testConfig(t, "n1", t.TempDir())
		cfg.Mesh = node.MeshPreset(size)
		if err := cfg.Validate(); err != nil {
			t.Errorf("size %d: %v", size, err)
		}
		want := mesh.PresetFor("x", size)
		if cfg.Mesh.ProbeInterval != want.ProbeInterval || cfg.Mesh.PushPullInterval != want.PushPullInterval || cfg.Mesh.InboundStreams != want.InboundStreams {
			t.Errorf("size %d: %+v is not the preset", size, cfg.Mesh)
		}
	}
	if d := node.DefaultConfig("n1").Mesh; d.ProbeInterval != node.MeshPreset(16).ProbeInterval || d.PushPullInterval != node.MeshPreset(16).PushPullInterval {
		t.Error("DefaultConfig's mesh tuning is not MeshPreset(16)")
	}
}

// DepartedPeerGrace below a second is refused: a peer would be pruned
// before a restart or a brief partition could end.
func TestConfigDepartedPeerGrace(t *testing.T) {
	for _, tc := range []struct {
		grace time.Duration
		ok    bool
	}{{0, false}, {time.Millisecond, false}, {time.Second, true}, {node.DefaultConfig("x").DepartedPeerGrace, true}} {
		c := testConfig(t, "n1", t.TempDir())
		c.DepartedPeerGrace = tc.grace
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, node.ErrBadConfig)) {
			t.Errorf("DepartedPeerGrace %v: Validate = %v, want ok=%v", tc.grace, err, tc.ok)
		}
	}
}

package mesh_test

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/mesh"
)

// TestMeasureDetection measures, over 10+ trials in a 5-node cluster, how
// long a killed node takes to be Dead at every survivor and how long a
// restarted node (same name and address, new boot id) takes to be Alive at
// every peer after New returns. Runs only with MESH_MEASURE=1; the bounds
// themselves are asserted by TestKillDetectedAsDead and
// TestRestartSameNameNewBootID.
func TestMeasureDetection(t *testing.T) {
	if os.Getenv("MESH_MEASURE") != "1" {
		t.Skip("set MESH_MEASURE=1 to measure detection times")
	}
	const trials = 10
	nodes := startCluster(t, 5, nil)
	waitConverged(t, nodes, 10*time.Second)
	var dead, alive []time.Duration
	for i := range trials {
		victim := nodes[1+i%4]
		others := slices.DeleteFunc(slices.Clone(nodes), func(n *testNode) bool { return n == victim })
		kill := time.Now()
		if err := victim.Kill(); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, "dead everywhere", func() bool {
			for _, o := range others {
				if stateAt(o, victim.LocalName()) != mesh.StateDead {
					return false
				}
			}
			return true
		})
		dead = append(dead, time.Since(kill))

		cfg := victim.cfg
		cfg.BindAddr = victim.GossipAddr()
		cfg.Meta = &pb.NodeMeta{QuicAddr: victim.cfg.Meta.GetQuicAddr(), BootId: ident.NewBootID()}
		cfg.Join = []string{nodes[0].GossipAddr()}
		if victim == nodes[0] {
			cfg.Join = []string{nodes[1].GossipAddr()}
		}
		n := start(t, cfg)
		up := time.Now()
		testutil.WaitFor(t, 10*time.Second, "alive everywhere", func() bool {
			for _, o := range others {
				m, ok := o.Member(cfg.NodeName)
				if !ok || m.State != mesh.StateAlive || m.BootID != cfg.Meta.GetBootId() {
					return false
				}
			}
			return true
		})
		alive = append(alive, time.Since(up))
		nodes[slices.Index(nodes, victim)] = n
	}
	report := func(what string, d []time.Duration) {
		slices.Sort(d)
		t.Logf("%s over %d trials: min %v median %v max %v", what, len(d),
			d[0].Round(time.Millisecond), d[len(d)/2].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
	}
	report("kill -> dead at all peers", dead)
	report("restart -> alive at all peers", alive)
}

package mesh_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mesh"
)

// Rotating the gossip key on a running cluster (install everywhere, use
// everywhere, remove the old one everywhere) moves it to the new key
// without a partition: nobody is ever suspected, a node with only the new
// key joins afterwards, and one with only the old key no longer can.
func TestKeyRotationWithoutPartition(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	waitConverged(t, nodes, 10*time.Second)
	next := bytes.Repeat([]byte{'k'}, 32)
	for _, step := range []func(*testNode) error{
		func(n *testNode) error { return n.InstallKey(next) },
		func(n *testNode) error { return n.UseKey(next) },
		func(n *testNode) error { return n.RemoveKey(testKey) },
	} {
		for _, n := range nodes {
			if err := step(n); err != nil {
				t.Fatal(err)
			}
		}
		// Gossip flows under the new state: a full push/pull round.
		waitConverged(t, nodes, 10*time.Second)
	}
	for _, n := range nodes {
		if c := n.events.count(mesh.EventSuspect, mesh.EventDead); c != 0 {
			t.Fatalf("%s saw %d suspicions or deaths during the rotation", n.LocalName(), c)
		}
		st, err := n.Keyring()
		if err != nil || st.Primary != mesh.KeyFingerprint(next) || len(st.Keys) != 1 {
			t.Fatalf("%s keyring %+v, %v; want only the new key", n.LocalName(), st, err)
		}
	}
	newcomer := testConfig(t, "new")
	newcomer.SecretKey, newcomer.Join = next, []string{nodes[0].GossipAddr()}
	joined := start(t, newcomer)
	testutil.WaitFor(t, 10*time.Second, "the newcomer with the new key joined", func() bool { return joined.NumAlive() == 4 })
	old := start(t, testConfig(t, "old")) // only the removed key
	if n, err := old.Join([]string{nodes[0].GossipAddr()}); err == nil || n != 0 {
		t.Fatalf("a node with only the removed key joined %d members (err %v)", n, err)
	}
}

// The keyring survives a restart: a member that rotated and restarts with
// its configured (old) key still speaks the new primary one.
func TestKeyringPersists(t *testing.T) {
	cfg := testConfig(t, "a")
	a := start(t, cfg)
	next := bytes.Repeat([]byte{'n'}, 32)
	if err := a.InstallKey(next); err != nil {
		t.Fatal(err)
	}
	if err := a.UseKey(next); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveKey(next); !errors.Is(err, mesh.ErrKeyring) {
		t.Fatalf("removing the primary key: %v, want ErrKeyring", err)
	}
	if err := a.InstallKey([]byte("short")); !errors.Is(err, mesh.ErrKeyring) {
		t.Fatalf("a short key: %v, want ErrKeyring", err)
	}
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	again := start(t, cfg)
	st, err := again.Keyring()
	if err != nil || st.Primary != mesh.KeyFingerprint(next) || len(st.Keys) != 2 {
		t.Fatalf("after a restart: %+v, %v; want the rotated primary and both keys", st, err)
	}
	plain := testConfig(t, "plain")
	plain.SecretKey = nil
	if _, err := start(t, plain).Keyring(); !errors.Is(err, mesh.ErrNoEncryption) {
		t.Fatalf("keyring without encryption: %v", err)
	}
}

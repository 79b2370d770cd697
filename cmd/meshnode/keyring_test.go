package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/meshnode/meshnode/internal/testutil"
)

// testKeyRotation rotates the gossip key of the running 3-daemon cluster
// with the keyring commands: install, use, remove, each applied by every
// member; nobody leaves the membership meanwhile, and every member ends
// with only the new key, primary.
func testKeyRotation(t *testing.T, c *cluster, n1 *daemon) {
	next := filepath.Join(c.certs, "gossip-2.key")
	mustCLI(t, "keygen", "--out", next)
	listed := func() admin.KeyringJSON {
		t.Helper()
		var out admin.KeyringJSON
		if err := json.Unmarshal([]byte(n1.cli(t, "keyring", "list", "--json")), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	before := listed()
	if len(before.Members) != 3 {
		t.Fatalf("keyring list answered for %d members, want 3: %+v", len(before.Members), before)
	}
	allAlive := func() bool {
		var ms struct {
			Members []admin.MemberJSON `json:"members"`
		}
		if json.Unmarshal([]byte(n1.cli(t, "members", "--json")), &ms) != nil {
			return false
		}
		alive := 0
		for _, m := range ms.Members {
			if m.State == "alive" {
				alive++
			}
		}
		return alive == 3
	}
	for _, op := range []struct{ verb, file string }{
		{"install", next}, {"use", next}, {"remove", filepath.Join(c.certs, "gossip.key")},
	} {
		n1.cli(t, "keyring", op.verb, "--key-file", op.file)
		if !allAlive() {
			t.Fatalf("after keyring %s a member is not alive", op.verb)
		}
	}
	after := listed()
	var primary string
	for name, r := range after.Members {
		if r.Error != "" || len(r.Keys) != 1 || r.Keys[0] != r.Primary || slices.Contains(r.Keys, before.Members[name].Primary) {
			t.Fatalf("%s after the rotation: %+v (before %+v)", name, r, before.Members[name])
		}
		if primary != "" && r.Primary != primary {
			t.Fatalf("members disagree on the primary key: %+v", after)
		}
		primary = r.Primary
	}
	// Gossip keeps flowing under the new key alone.
	testutil.WaitFor(t, 10*time.Second, "every member alive under the new key", allAlive)
	if code, _, errOut := rc(t, nil, "keyring", "use", "--admin", n1.admin); code != exitUsage || !strings.Contains(errOut, "--key-file") {
		t.Errorf("keyring use without a key: exit %d %q", code, errOut)
	}
}

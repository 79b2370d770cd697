package testnet

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
)

// inboxLast returns the newest cursor of daemon i's inbox name, asked over
// its admin API while it runs.
func inboxLast(t *testing.T, c *ProcCluster, i int, name string) uint64 {
	t.Helper()
	var out struct {
		Inboxes []struct {
			Name       string `json:"name"`
			LastCursor uint64 `json:"last_cursor"`
		} `json:"inboxes"`
	}
	err := c.call(i, "inbox list", func(ctx context.Context, ac *admin.Client) error {
		return ac.Do(ctx, "GET", "/v1/inbox", nil, &out, 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range out.Inboxes {
		if b.Name == name {
			return b.LastCursor
		}
	}
	return 0
}

// A receiving daemon is SIGKILLed again and again while it drains a
// backlog into its inbox, and restarted on its data directory. The inbox
// stores a batch in its own commit and the stream's watermark is
// committed after it, so each kill can leave stored messages whose
// watermark is not on disk; their sender, never told PROCESSED, sends
// them again under new msg ids. The inbox must store each message once
// and in order (it keeps each stream's last stored sequence in the same
// commit as the messages): a program pulling it cannot tell copies apart.
func TestInboxStoresEachMessageOnceAcrossReceiverKills(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real meshnode daemons; runs without -short")
	}
	const k = 3000
	bin := buildMeshnode(t)
	c := NewProcs(t, bin, 2, WithInboxes("box"))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := c.Kill(1); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for n := 1; n <= k; n++ {
		if out, err := c.Send(0, "box@n1", map[string]any{"n": n}, ""); err != nil || out != "Queued" {
			t.Fatalf("send %d to the stopped receiver: %q %v", n, out, err)
		}
	}
	if err := c.Restart(1); err != nil {
		t.Fatal(err)
	}
	// Kill n1 each time its inbox has grown by 100–400 messages since it
	// started, up to 10 times.
	rng := rand.New(rand.NewPCG(33, 1))
	kills := 0
	for range 10 {
		start := inboxLast(t, c, 1, "box")
		if start >= k {
			break
		}
		// Polled without a pause: the drain stores thousands of messages
		// in tens of milliseconds.
		deadline := time.Now().Add(60 * time.Second)
		for inboxLast(t, c, 1, "box") < min(start+uint64(100+rng.IntN(300)), k) {
			if time.Now().After(deadline) {
				t.Fatal("n1 does not store the backlog")
			}
		}
		if err := c.Kill(1); err != nil {
			t.Fatal(err)
		}
		kills++
		if err := c.Restart(1); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDrained(ctx); err != nil {
		t.Fatal(err)
	}

	copies := map[int][]string{} // n -> "cursor msg_id" of each copy
	var order []int
	for _, m := range pullAll(t, c, 1, "box") {
		var body struct{ N int }
		if err := json.Unmarshal(m.Body, &body); err != nil {
			t.Fatalf("cursor %d: %v", m.Cursor, err)
		}
		copies[body.N] = append(copies[body.N], fmt.Sprintf("cursor %d msg_id %s", m.Cursor, m.MsgID))
		order = append(order, body.N)
	}
	var missing, twice []int
	for n := 1; n <= k; n++ {
		switch len(copies[n]) {
		case 0:
			missing = append(missing, n)
		case 1:
		default:
			twice = append(twice, n)
		}
	}
	backwards := 0
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			backwards++
		}
	}
	t.Logf("%d kills of the receiver while it stored %d messages", kills, k)
	if len(missing) > 0 {
		t.Errorf("%d Queued messages missing from the inbox, first %v", len(missing), missing[:min(5, len(missing))])
	}
	if len(twice) > 0 || backwards > 0 {
		var ex []string
		for _, n := range twice[:min(3, len(twice))] {
			ex = append(ex, fmt.Sprintf("  n=%d: %s", n, strings.Join(copies[n], "; ")))
		}
		t.Errorf("%d stored for %d sent: %d stored more than once, the order goes back %d times; e.g.\n%s",
			len(order), k, len(twice), backwards, strings.Join(ex, "\n"))
	}
}

package mailbox_test

import (
	"context"
	"testing"

	"github.com/meshnode/meshnode/mailbox"
)

// TestPostDoesNotAllocate: in steady state (ring already grown, or an
// idle->busy->idle cycle within the kept 8-slot ring) Post allocates nothing.
func TestPostDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	t.Run("busy", func(t *testing.T) {
		g := newGatedBox(t, 1000, mailbox.Reject)
		for i := 1; i <= 300; i++ { // grow the ring to 512 slots
			if err := g.m.Post(i); err != nil {
				t.Fatal(err)
			}
		}
		allocs := testing.AllocsPerRun(100, func() {
			if err := g.m.Post(1); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("Post allocates %.1f times per call", allocs)
		}
	})
	t.Run("idle cycle", func(t *testing.T) {
		m, err := mailbox.New(mailbox.Config[int]{Handle: func(int) {}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		cycle := func() {
			if err := m.Post(1); err != nil {
				t.Fatal(err)
			}
			if err := m.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		cycle() // allocate the 8-slot ring once
		// Drain may allocate its wait channel; Post+goroutine start must not
		// allocate more than that one channel.
		if allocs := testing.AllocsPerRun(100, cycle); allocs > 1 {
			t.Fatalf("idle->busy->idle cycle allocates %.1f times", allocs)
		}
	})
}

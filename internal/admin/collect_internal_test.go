package admin

import (
	"errors"
	"testing"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/prometheus/client_golang/prometheus"
)

// stoppedInbox is an inbox store that stopped after a failed sync.
type stoppedInbox struct{ Inbox }

func (stoppedInbox) Stats() map[string]inbox.Stats { return map[string]inbox.Stats{"box": {Depth: 3}} }
func (stoppedInbox) Err() error                    { return errors.New("inbox: store failed") }

// meshnode_inbox_failed is 1 once the inbox store stopped.
func TestInboxFailedGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(inboxCollector{stoppedInbox{}})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "meshnode_inbox_failed" {
			if v := f.GetMetric()[0].GetGauge().GetValue(); v != 1 {
				t.Fatalf("meshnode_inbox_failed = %v, want 1", v)
			}
			return
		}
	}
	t.Fatal("no meshnode_inbox_failed family")
}

package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
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

// GET /v1/inbox says why a stopped inbox store stopped, beside what it held.
func TestInboxListShowsAStoppedStore(t *testing.T) {
	s := &Server{cfg: Config{Inbox: stoppedInbox{}}}
	rec := httptest.NewRecorder()
	s.inboxList(rec, httptest.NewRequest(http.MethodGet, "/v1/inbox", nil))
	var out struct {
		Inboxes []struct {
			Name  string `json:"name"`
			Depth int    `json:"depth"`
		} `json:"inboxes"`
		Failure string `json:"failure"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("GET /v1/inbox: %d %s (%v)", rec.Code, rec.Body, err)
	}
	if out.Failure != "inbox: store failed" || len(out.Inboxes) != 1 || out.Inboxes[0].Name != "box" || out.Inboxes[0].Depth != 3 {
		t.Fatalf("GET /v1/inbox = %+v, want box with depth 3 and the store's failure", out)
	}
}

package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The listing commands say when a store stopped after a failed sync, with
// the daemon's reason.
func TestListingsShowAStoppedStore(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/inbox":
			_, _ = w.Write([]byte(`{"inboxes":[{"name":"box","depth":3,"last_cursor":7}],"failure":"inbox: store failed: fdatasync: input/output error"}`))
		case "/v1/outbox/stats":
			_, _ = w.Write([]byte(`{"depth":1,"failure":"outbox: store failed: fdatasync: input/output error"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer api.Close()
	addr := strings.TrimPrefix(api.URL, "http://")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"inbox", "list"}, "FAILED: the inbox store stopped (check the disk, then restart the daemon): inbox: store failed: fdatasync: input/output error"},
		{[]string{"outbox", "stats"}, "outbox: store failed: fdatasync: input/output error"},
	} {
		code, out, errOut := rc(t, nil, append(c.args, "--admin", addr)...)
		if code != 0 || !strings.Contains(out, c.want) || !strings.Contains(out, "FAILED") {
			t.Errorf("meshnode %v: exit %d, stdout %q, stderr %q; want a FAILED line with %q", c.args, code, out, errOut, c.want)
		}
	}
}

package admin_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
)

// newServerWith builds a server on a fake backend after mutate.
func newServerWith(tb testing.TB, mutate func(*admin.Config)) (*httptest.Server, *admin.Server, *fakeBackend) {
	tb.Helper()
	fb := &fakeBackend{outcome: node.Queued}
	cfg := admin.DefaultConfig()
	cfg.Backend = fb
	mutate(&cfg)
	s, err := admin.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ts := httptest.NewServer(s)
	tb.Cleanup(ts.Close)
	return ts, s, fb
}

func get(tb testing.TB, ts *httptest.Server, path string) int {
	tb.Helper()
	resp, err := ts.Client().Get(ts.URL + path)
	if err != nil {
		tb.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func TestProbes(t *testing.T) {
	notReady := errors.New("not joined yet")
	var broken error
	ts, _, _ := newServerWith(t, func(c *admin.Config) {
		c.Token = "secret"
		c.Ready = func() error { return notReady }
		c.Live = func() error { return broken }
	})
	if st := get(t, ts, "/healthz"); st != http.StatusOK {
		t.Errorf("/healthz without token = %d, want 200", st)
	}
	broken = errors.New("outbox: store failed")
	if status, out := call(t, ts, "GET", "/healthz", "", ""); status != http.StatusServiceUnavailable || out["reason"] != "outbox: store failed" {
		t.Errorf("/healthz with a failed store = %d %v, want 503 with the reason", status, out)
	}
	broken = nil
	status, out := call(t, ts, "GET", "/readyz", "", "")
	if status != http.StatusServiceUnavailable || out["reason"] != "not joined yet" {
		t.Errorf("/readyz before ready = %d %v, want 503 with the reason", status, out)
	}
	notReady = nil
	if st := get(t, ts, "/readyz"); st != http.StatusOK {
		t.Errorf("/readyz when ready = %d", st)
	}
	if st := get(t, ts, "/version"); st != http.StatusUnauthorized {
		t.Errorf("/version without token = %d, want 401 (only probes are open)", st)
	}
	status, out = call(t, ts, "GET", "/version", "", "secret")
	if status != 200 || out["version"] == "" || out["go_version"] == nil {
		t.Errorf("/version = %d %v", status, out)
	}
}

func TestPprofIsOptIn(t *testing.T) {
	off, _, _ := newServerWith(t, func(*admin.Config) {})
	if st := get(t, off, "/debug/pprof/"); st != http.StatusNotFound {
		t.Errorf("pprof off: /debug/pprof/ = %d, want 404", st)
	}
	on, _, _ := newServerWith(t, func(c *admin.Config) { c.Pprof = true })
	if st := get(t, on, "/debug/pprof/goroutine?debug=1"); st != http.StatusOK {
		t.Errorf("pprof on: goroutine profile = %d, want 200", st)
	}
}

func TestSetToken(t *testing.T) {
	ts, s, _ := newServerWith(t, func(c *admin.Config) { c.Token = "old" })
	if err := s.SetToken("new"); err != nil {
		t.Fatal(err)
	}
	if st, _ := call(t, ts, "GET", "/v1/members", "", "old"); st != http.StatusUnauthorized {
		t.Errorf("old token after reload: %d, want 401", st)
	}
	if st, _ := call(t, ts, "GET", "/v1/members", "", "new"); st != http.StatusOK {
		t.Errorf("new token after reload: %d, want 200", st)
	}
	_, public, _ := newServerWith(t, func(c *admin.Config) { c.Addr, c.Token, c.TLS = "0.0.0.0:7948", "t", &tls.Config{} })
	if err := public.SetToken(""); !errors.Is(err, admin.ErrBadConfig) {
		t.Errorf("removing the token of a public API: %v, want ErrBadConfig", err)
	}
}

// Errors read once: the operation and destination, then what happened,
// without package prefixes or Go field names; the code tells programs
// what kind of failure it was.
func TestErrorsReadOnce(t *testing.T) {
	tests := []struct {
		name, path, body string
		err              error
		status           int
		code, want       string
	}{
		{"unreachable tell", "/v1/tell", `{"to":"box@n9"}`, fmt.Errorf("node: tell box@n9: %w", node.ErrUnreachable),
			503, admin.CodeUnreachable, `tell box@n9: node "n9" is unreachable`},
		{"remote no such actor", "/v1/ask", `{"to":"nosuch@edge2"}`,
			fmt.Errorf("node: ask nosuch@edge2: %w", &mailbox.RemoteError{Code: mailbox.NoSuchActor, Message: "mailbox: no such actor"}),
			404, admin.CodeNotFound, `ask nosuch@edge2: no actor "nosuch" runs on node "edge2"`},
		{"full", "/v1/send", `{"to":"box@n2"}`, &node.CapacityError{RetryAfter: 1500 * time.Millisecond},
			429, admin.CodeCapacity, "send box@n2: the recipient is full: try again in 1.5s"},
		{"deadline", "/v1/ask", `{"to":"box@n2"}`, context.DeadlineExceeded, 504, admin.CodeTimeout, "ask box@n2: no answer before the deadline"},
		{"outcome unknown", "/v1/send", `{"to":"box@n2"}`, fmt.Errorf("node: tell-reliable box@n2: partition: send to box@n2: its TTL ran out during a direct attempt without a verdict: %w", node.ErrOutcomeUnknown),
			504, admin.CodeTimeout, "send box@n2: no verdict from the recipient in time, and it may have run the message: send it again only with an idempotency key"},
		{"outcome unknown, then the outbox failed", "/v1/send", `{"to":"box@n2"}`, fmt.Errorf("node: tell-reliable box@n2: partition: send to box@n2: not stored after a direct attempt without a verdict: %w: outbox: commit: %w: fdatasync: input/output error", node.ErrOutcomeUnknown, node.ErrStoreFailed),
			507, admin.CodeInternal, "restart the node; the recipient may have run the message: send it again only with an idempotency key"},
		{"failed outbox", "/v1/send", `{"to":"box@n2"}`, fmt.Errorf("node: send box@n2: outbox: commit: %w: fdatasync: input/output error", node.ErrStoreFailed),
			507, admin.CodeInternal, "send box@n2: this node's outbox stopped taking messages"},
		{"empty filter", "/v1/dlq/purge", `{}`, nil, 400, admin.CodeBadRequest, "--all"},
		{"negative ttl", "/v1/send", `{"to":"box@n2","ttl":"-1s"}`, nil, 400, admin.CodeBadRequest, `ttl "-1s"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, _, fb := newServerWith(t, func(*admin.Config) {})
			fb.err = tt.err
			status, out := call(t, ts, "POST", tt.path, tt.body, "")
			msg, _ := out["error"].(string)
			if status != tt.status || out["code"] != tt.code || !strings.Contains(msg, tt.want) {
				t.Fatalf("got %d %v, want %d %s containing %q", status, out, tt.status, tt.code, tt.want)
			}
			for _, stutter := range []string{"node:", "mailbox:", "outbox:", "needs All"} {
				if strings.Contains(msg, stutter) {
					t.Errorf("error %q contains %q", msg, stutter)
				}
			}
		})
	}
}

// A pull or ack refused by an inbox store that stopped after a failed
// sync reads as what to do (restart), with no package prefixes.
func TestStoppedInboxReadsOnce(t *testing.T) {
	err := fmt.Errorf("inbox: pull %q: %w: fdatasync inbox.db: input/output error", "box", inbox.ErrFailed)
	msg := admin.Describe(err)
	if !strings.Contains(msg, "inbox store stopped") || !strings.Contains(msg, "restart the daemon") || strings.Contains(msg, "inbox:") {
		t.Fatalf("Describe = %q", msg)
	}
}

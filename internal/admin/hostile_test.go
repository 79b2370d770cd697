package admin_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestCrossOriginWriteRefused sends what a web page in a browser on the
// operator's machine can make it send to the token-less API: the exact
// request of the attack (no body, no Content-Type, a foreign Origin), and
// its variants. None may change anything.
func TestCrossOriginWriteRefused(t *testing.T) {
	ts, _, st := newServer(t, "")
	tests := []struct {
		name    string
		headers map[string]string
		body    string
		status  int
	}{
		{"the attack: no body, no type, foreign origin", map[string]string{"Origin": "http://evil.example"}, "", http.StatusForbidden},
		{"no origin, no type", nil, "", http.StatusUnsupportedMediaType},
		{"form post", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, "a=b", http.StatusUnsupportedMediaType},
		{"json with a foreign origin", map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example"}, "", http.StatusForbidden},
		{"json from the API's own origin", map[string]string{"Content-Type": "application/json", "Origin": ts.URL}, "", http.StatusForbidden},
		{"fetch metadata: cross-site", map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, "", http.StatusForbidden},
		{"fetch metadata: same-site", map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, "", http.StatusForbidden},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprint("evil", i)
			req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/inbox/"+name, strings.NewReader(tt.body))
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
			for _, n := range st.Inboxes() {
				if n == name {
					t.Fatalf("inbox %q was created", name)
				}
			}
		})
	}
	// The CLI's request (JSON type, no Origin) still works, and a GET from a
	// program needs no type.
	if status, out := call(t, ts, http.MethodPost, "/v1/inbox/ok", "", ""); status != http.StatusCreated {
		t.Fatalf("declare from a program: %d %v", status, out)
	}
	if status, _ := call(t, ts, http.MethodGet, "/v1/inbox", "", ""); status != http.StatusOK {
		t.Fatalf("list: %d", status)
	}
}

// TestBadSendOptionsAre400: a send the node refuses for its options (an
// over-long idempotency key, bad options, too large) is the client's
// mistake, not the daemon's.
func TestBadSendOptionsAre400(t *testing.T) {
	ts, fb, _ := newServer(t, "")
	for _, tc := range []struct {
		err    error
		status int
	}{
		{fmt.Errorf("node: tell-reliable a@n2: idempotency key of 5000 bytes (max 1024): %w", node.ErrBadKey), http.StatusBadRequest},
		{fmt.Errorf("node: tell-reliable a@n2: %w: 100 headers", node.ErrBadOption), http.StatusBadRequest},
		{fmt.Errorf("node: tell-reliable a@n2: %w", node.ErrTooLarge), http.StatusRequestEntityTooLarge},
	} {
		fb.mu.Lock()
		fb.err = tc.err
		fb.mu.Unlock()
		status, out := call(t, ts, http.MethodPost, "/v1/send", `{"to":"a@n2","key":"`+strings.Repeat("k", 5000)+`"}`, "")
		if status != tc.status || out["code"] != admin.CodeBadRequest {
			t.Fatalf("%v: %d %v, want %d bad_request", tc.err, status, out, tc.status)
		}
	}
}

// TestPullBoundedByBytes: a pull answers at most MaxPullBytes of stored
// messages (at least one), however many are asked for; the client pages
// through the rest with next_after.
func TestPullBoundedByBytes(t *testing.T) {
	ts, _, st := newServer(t, "")
	if _, err := st.Declare("big"); err != nil {
		t.Fatal(err)
	}
	const n, size = 6, 3 << 19
	body, err := anypb.New(wrapperspb.Bytes(make([]byte, size)))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := st.Append(context.Background(), "big", &pb.Envelope{MsgId: fmt.Sprint(i), Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	after, got := uint64(0), 0
	for got < n {
		resp, err := ts.Client().Get(fmt.Sprintf("%s/v1/inbox/big/pull?after=%d&max=1000", ts.URL, after))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		// 4 MiB of stored messages, rendered as base64: under 6 MiB.
		if len(data) > 6<<20 {
			t.Fatalf("one pull answered %d MiB", len(data)>>20)
		}
		var out struct {
			Messages  []json.RawMessage `json:"messages"`
			NextAfter uint64            `json:"next_after"`
		}
		if err := json.Unmarshal(data, &out); err != nil || len(out.Messages) == 0 {
			t.Fatalf("pull after %d: %v, %d messages", after, err, len(out.Messages))
		}
		got += len(out.Messages)
		after = out.NextAfter
	}
	if got != n {
		t.Fatalf("paged through %d messages, want %d", got, n)
	}
}

// TestTokenNeverInClearOffLoopback: off loopback the API needs a token
// and TLS; served with TLS, a plain HTTP request carrying the token gets
// no answer from the API, and an HTTPS one does.
func TestTokenNeverInClearOffLoopback(t *testing.T) {
	cfg := admin.DefaultConfig()
	cfg.Addr, cfg.Token, cfg.Backend = "0.0.0.0:0", "s3cret", &fakeBackend{}
	if _, err := admin.New(cfg); !errors.Is(err, admin.ErrBadConfig) {
		t.Fatalf("token over plain HTTP off loopback: New = %v, want ErrBadConfig", err)
	}
	ca, err := transport.NewCA("admin test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ca.NewIdentity("n1")
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLS = &tls.Config{Certificates: []tls.Certificate{id.Cert}, MinVersion: tls.VersionTLS12}
	s, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Serve(l)
	t.Cleanup(func() { _ = s.Close() })
	get := func(c *http.Client, scheme string) (int, error) {
		req, _ := http.NewRequest(http.MethodGet, scheme+"://"+l.Addr().String()+"/v1/members", nil)
		req.Header.Set("Authorization", "Bearer s3cret")
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	if status, err := get(http.DefaultClient, "http"); err == nil && status == http.StatusOK {
		t.Fatal("the API answered a plain HTTP request")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: id.Roots, ServerName: "n1", MinVersion: tls.VersionTLS12}
	c := &http.Client{Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	if status, err := get(c, "https"); err != nil || status != http.StatusOK {
		t.Fatalf("HTTPS with the token: %d %v", status, err)
	}
}

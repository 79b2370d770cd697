package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fakeBackend records what the API asked of the node.
type fakeBackend struct {
	mu       sync.Mutex
	told     []proto.Message
	to       []node.Address
	err      error // returned by every send when set
	outcome  node.Outcome
	filters  []outbox.DLQFilter
	dls      []outbox.DeadLetter
	askReply *structpb.Struct
}

func (f *fakeBackend) Name() string { return "n1" }

func (f *fakeBackend) Members() []mesh.Member {
	return []mesh.Member{
		{Name: "n1", State: mesh.StateAlive, GossipAddr: "127.0.0.1:1", Since: time.Now().Add(-time.Minute)},
		{Name: "n2", State: mesh.StateDead, GossipAddr: "127.0.0.1:2", Since: time.Now()},
	}
}

func (f *fakeBackend) record(to node.Address, m proto.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.to, f.told = append(f.to, to), append(f.told, m)
	return f.err
}

func (f *fakeBackend) Tell(_ context.Context, to node.Address, m proto.Message) error {
	return f.record(to, m)
}

func (f *fakeBackend) Ask(_ context.Context, to node.Address, req, resp proto.Message) error {
	if err := f.record(to, req); err != nil {
		return err
	}
	proto.Merge(resp, f.askReply)
	return nil
}

func (f *fakeBackend) TellReliable(_ context.Context, to node.Address, m proto.Message, _ ...node.SendOption) (node.Outcome, error) {
	if err := f.record(to, m); err != nil {
		return 0, err
	}
	return f.outcome, nil
}

func (f *fakeBackend) Stats() node.Stats {
	return node.Stats{TellSent: 3, AskOK: 2, ReliableQueued: 5, DedupeHits: 7}
}

func (f *fakeBackend) OutboxStats() node.OutboxStats {
	return node.OutboxStats{Stats: outbox.Stats{Depth: 4, DepthByPeer: map[string]int{"n2": 4}, OldestAge: time.Second, CommitFailures: 6, StreamsForgotten: 7,
		Failure: "outbox: store failed: fdatasync: input/output error"},
		LimitByPeer: map[string]int{"n2": 10}, Restores: 2}
}

func (f *fakeBackend) ActorStats() []node.ActorStats {
	busy := node.ActorStats{Name: "busy"}
	busy.Depth, busy.Rejected = 2, 5
	return []node.ActorStats{busy, {Name: "idle"}}
}

func (f *fakeBackend) PeerStats() map[string]transport.PeerStats {
	return map[string]transport.PeerStats{"n2": {FramesIn: 1, FramesOut: 2, BytesIn: 3, BytesOut: 4}}
}

func (f *fakeBackend) DeadLetters(fl outbox.DLQFilter) ([]outbox.DeadLetter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filters = append(f.filters, fl)
	return f.dls, nil
}

func (f *fakeBackend) Replay(fl outbox.DLQFilter) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filters = append(f.filters, fl)
	return 2, nil
}

func (f *fakeBackend) Purge(fl outbox.DLQFilter) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filters = append(f.filters, fl)
	if !fl.All && fl.Recipient == "" && len(fl.IDs) == 0 && fl.Reason == "" && fl.OlderThan == 0 {
		return 0, outbox.ErrEmptyFilter
	}
	return 3, nil
}

// storeInbox is the real inbox store with Declare as the Inbox interface wants.
type storeInbox struct{ *inbox.Store }

func newServer(tb testing.TB, token string) (*httptest.Server, *fakeBackend, *inbox.Store) {
	tb.Helper()
	st, err := inbox.Open(inbox.DefaultConfig(filepath.Join(tb.TempDir(), "inbox.db")))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	fb := &fakeBackend{outcome: node.Queued, askReply: &structpb.Struct{Fields: map[string]*structpb.Value{"ok": structpb.NewBoolValue(true)}}}
	cfg := admin.DefaultConfig()
	cfg.Token, cfg.Backend, cfg.Inbox = token, fb, storeInbox{st}
	s, err := admin.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ts := httptest.NewServer(s)
	tb.Cleanup(ts.Close)
	return ts, fb, st
}

func call(tb testing.TB, ts *httptest.Server, method, path, body string, token string) (int, map[string]any) {
	tb.Helper()
	req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
	if body != "" || method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out
}

func TestSendHandlers(t *testing.T) {
	ts, fb, _ := newServer(t, "")
	tests := []struct {
		name, path, body string
		status           int
		want             string // a key of the answer, or a substring of the error
		payload          proto.Message
	}{
		{"tell json", "/v1/tell", `{"to":"a@n2","body":{"x":1}}`, 200, "ok", mustStruct(map[string]any{"x": 1})},
		{"tell raw", "/v1/tell", `{"to":"a@n2","raw":"aGk="}`, 200, "ok", wrapperspb.Bytes([]byte("hi"))},
		{"tell scalar", "/v1/tell", `{"to":"a@n2","body":"hi"}`, 200, "ok", structpb.NewStringValue("hi")},
		{"tell no body", "/v1/tell", `{"to":"a@n2"}`, 200, "ok", &structpb.Struct{}},
		{"ask", "/v1/ask", `{"to":"a@n2","body":{}}`, 200, "reply", &structpb.Struct{}},
		{"send", "/v1/send", `{"to":"a@n2","body":{},"key":"k","ttl":"1h"}`, 200, "outcome", &structpb.Struct{}},
		{"bad json", "/v1/tell", `{`, 400, "not a JSON request", nil},
		{"no to", "/v1/tell", `{}`, 400, `"to"`, nil},
		{"bad address", "/v1/tell", `{"to":"nobody"}`, 400, "bad address", nil},
		{"body and raw", "/v1/send", `{"to":"a@n2","body":{},"raw":"aGk="}`, 400, "not both", nil},
		{"bad ttl", "/v1/send", `{"to":"a@n2","ttl":"soon"}`, 400, "ttl", nil},
		{"key and overwrite", "/v1/send", `{"to":"a@n2","key":"a","overwrite":"b"}`, 400, "not both", nil},
		{"wrong method", "/v1/send", ``, 405, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb.mu.Lock()
			before := len(fb.told)
			fb.mu.Unlock()
			method := "POST"
			if tt.status == 405 {
				method = "GET"
			}
			status, out := call(t, ts, method, tt.path, tt.body, "")
			if status != tt.status {
				t.Fatalf("status %d, want %d (%v)", status, tt.status, out)
			}
			if tt.status == 200 {
				if _, ok := out[tt.want]; !ok {
					t.Fatalf("answer %v lacks %q", out, tt.want)
				}
				fb.mu.Lock()
				got := fb.told[len(fb.told)-1]
				fb.mu.Unlock()
				if !proto.Equal(got, tt.payload) {
					t.Fatalf("payload %v, want %v", got, tt.payload)
				}
			} else if tt.want != "" && !strings.Contains(fmt.Sprint(out["error"]), tt.want) {
				t.Fatalf("error %q lacks %q", out["error"], tt.want)
			} else {
				fb.mu.Lock()
				defer fb.mu.Unlock()
				if len(fb.told) != before {
					t.Fatal("a refused request reached the node")
				}
			}
		})
	}
	if _, out := call(t, ts, "POST", "/v1/send", `{"to":"a@n2"}`, ""); out["outcome"] != "Queued" {
		t.Fatalf("send outcome %v", out)
	}
}

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return s
}

func TestErrorStatuses(t *testing.T) {
	ts, fb, _ := newServer(t, "")
	tests := []struct {
		err    error
		status int
	}{
		{fmt.Errorf("x: %w", node.ErrUnreachable), 503},
		{fmt.Errorf("x: %w", node.ErrStoreFailed), 507},
		{fmt.Errorf("x: %w", node.ErrNoSuchActor), 404},
		{&node.CapacityError{RetryAfter: 1500 * time.Millisecond}, 429},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), 504},
		{errors.New("boom"), 500},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			fb.mu.Lock()
			fb.err = tt.err
			fb.mu.Unlock()
			status, out := call(t, ts, "POST", "/v1/tell", `{"to":"a@n2"}`, "")
			if status != tt.status || out["error"] == "" {
				t.Fatalf("status %d %v, want %d", status, out, tt.status)
			}
			if tt.status == 429 && out["retry_after_ms"] != float64(1500) {
				t.Fatalf("retry_after_ms = %v", out["retry_after_ms"])
			}
		})
	}
}

func TestToken(t *testing.T) {
	ts, _, _ := newServer(t, "s3cret")
	for _, tok := range []string{"", "wrong"} {
		if status, _ := call(t, ts, "GET", "/v1/members", "", tok); status != 401 {
			t.Fatalf("token %q: status %d, want 401", tok, status)
		}
	}
	if status, out := call(t, ts, "GET", "/v1/members", "", "s3cret"); status != 200 || len(out["members"].([]any)) != 2 {
		t.Fatalf("with token: %d %v", status, out)
	}
}

func TestCheckAddr(t *testing.T) {
	tests := []struct {
		addr, token string
		tls         bool
		ok          bool
	}{
		{"127.0.0.1:7948", "", false, true},
		{"[::1]:7948", "", false, true},
		{"localhost:7948", "", false, true},
		{"127.0.0.1:7948", "tok", false, true}, // a token on loopback never crosses the network
		{"0.0.0.0:7948", "", true, false},
		{":7948", "", true, false},
		{"10.1.2.3:7948", "", true, false},
		{"10.1.2.3:7948", "tok", false, false}, // the token would cross the network in clear
		{"10.1.2.3:7948", "tok", true, true},
		{"nonsense", "tok", true, false},
	}
	for _, tt := range tests {
		if err := admin.CheckAddr(tt.addr, tt.token, tt.tls); (err == nil) != tt.ok {
			t.Errorf("CheckAddr(%q, %q, tls %v) = %v, want ok=%v", tt.addr, tt.token, tt.tls, err, tt.ok)
		}
	}
}

func TestOutboxStatsHandler(t *testing.T) {
	ts, _, _ := newServer(t, "")
	status, out := call(t, ts, "GET", "/v1/outbox/stats", "", "")
	if status != 200 {
		t.Fatalf("outbox stats: %d %v", status, out)
	}
	for k, want := range map[string]float64{"depth": 4, "oldest_age_seconds": 1, "commit_failures": 6, "stream_restores": 2, "streams_forgotten": 7} {
		if out[k] != want {
			t.Errorf("%s = %v, want %v (%v)", k, out[k], want, out)
		}
	}
	if out["failure"] != "outbox: store failed: fdatasync: input/output error" {
		t.Errorf("failure = %v, want the outbox's failure", out["failure"])
	}
	if lim := out["limit_by_peer"].(map[string]any); lim["n2"] != float64(10) {
		t.Errorf("limit_by_peer = %v", lim)
	}
}

func TestDLQHandlers(t *testing.T) {
	ts, fb, _ := newServer(t, "")
	body, _ := anypb.New(mustStruct(map[string]any{"n": 1}))
	fb.dls = []outbox.DeadLetter{{ID: "01", Recipient: "a@n2", Reason: "expired", At: time.Now(),
		Message: &pb.StoredMessage{Envelope: &pb.Envelope{MsgId: "m1", Body: body}, Attempts: 3}}}
	status, out := call(t, ts, "GET", "/v1/dlq?recipient=a@n2&reason=exp&limit=5&older_than=1m", "", "")
	if status != 200 {
		t.Fatalf("list: %d %v", status, out)
	}
	dl := out["dead_letters"].([]any)[0].(map[string]any)
	if dl["msg_id"] != "m1" || dl["reason"] != "expired" || dl["body"].(map[string]any)["n"] != float64(1) {
		t.Fatalf("dead letter = %v", dl)
	}
	fb.mu.Lock()
	f := fb.filters[0]
	fb.mu.Unlock()
	if f.Recipient != "a@n2" || f.Reason != "exp" || f.Limit != 5 || f.OlderThan != time.Minute {
		t.Fatalf("filter = %+v", f)
	}
	if status, out := call(t, ts, "POST", "/v1/dlq/replay", `{"ids":["01"]}`, ""); status != 200 || out["replayed"] != float64(2) {
		t.Fatalf("replay: %d %v", status, out)
	}
	if status, _ := call(t, ts, "POST", "/v1/dlq/purge", `{}`, ""); status != 400 {
		t.Fatalf("purge with empty filter: %d, want 400", status)
	}
	if status, out := call(t, ts, "POST", "/v1/dlq/purge", `{"all":true}`, ""); status != 200 || out["purged"] != float64(3) {
		t.Fatalf("purge all: %d %v", status, out)
	}
	if status, _ := call(t, ts, "GET", "/v1/dlq?limit=x", "", ""); status != 400 {
		t.Fatalf("bad limit: %d", status)
	}
	if status, _ := call(t, ts, "POST", "/v1/dlq/purge", `{"older_than":"x"}`, ""); status != 400 {
		t.Fatalf("bad older_than: %d", status)
	}
}

func TestInboxHandlers(t *testing.T) {
	ts, _, st := newServer(t, "")
	if status, out := call(t, ts, "POST", "/v1/inbox/orders", "", ""); status != 201 || out["created"] != true {
		t.Fatalf("declare: %d %v", status, out)
	}
	if status, out := call(t, ts, "POST", "/v1/inbox/orders", "", ""); status != 200 || out["created"] != false {
		t.Fatalf("second declare: %d %v", status, out)
	}
	if status, _ := call(t, ts, "POST", "/v1/inbox/a@b", "", ""); status != 400 {
		t.Fatalf("bad name: %d", status)
	}
	// A long poll is woken by an append.
	done := make(chan map[string]any, 1)
	go func() {
		_, out := call(t, ts, "GET", "/v1/inbox/orders/pull?after=0&wait=10s", "", "")
		done <- out
	}()
	body, _ := anypb.New(wrapperspb.Bytes([]byte("hi")))
	if _, err := st.Append(context.Background(), "orders", &pb.Envelope{MsgId: "m1", Sender: "@n2", Body: body}); err != nil {
		t.Fatal(err)
	}
	select {
	case out := <-done:
		msgs, _ := out["messages"].([]any)
		if len(msgs) != 1 {
			t.Fatalf("long poll answered %v, want one message", out)
		}
		m, _ := msgs[0].(map[string]any)
		if m["cursor"] != float64(1) || m["raw"] != "aGk=" || m["msg_id"] != "m1" || out["next_after"] != float64(1) {
			t.Fatalf("pull = %v", out)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long poll not woken")
	}
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"ack beyond", "POST", "/v1/inbox/orders/ack", `{"up_to":2}`, 409},
		{"ack missing up_to", "POST", "/v1/inbox/orders/ack", `{}`, 400},
		{"ack unknown inbox", "POST", "/v1/inbox/nope/ack", `{"up_to":0}`, 404},
		{"ack", "POST", "/v1/inbox/orders/ack", `{"up_to":1}`, 200},
		{"pull bad after", "GET", "/v1/inbox/orders/pull?after=-1", ``, 400},
		{"pull bad wait", "GET", "/v1/inbox/orders/pull?wait=x", ``, 400},
		{"pull unknown", "GET", "/v1/inbox/nope/pull", ``, 404},
		{"list", "GET", "/v1/inbox", ``, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if status, out := call(t, ts, tt.method, tt.path, tt.body, ""); status != tt.status {
				t.Fatalf("status %d, want %d (%v)", status, tt.status, out)
			}
		})
	}
	if _, out := call(t, ts, "GET", "/v1/inbox/orders/pull?after=0", "", ""); len(out["messages"].([]any)) != 0 {
		t.Fatalf("acked message pulled again: %v", out)
	}
}

func TestMetrics(t *testing.T) {
	ts, _, st := newServer(t, "")
	if _, err := st.Declare("orders"); err != nil {
		t.Fatal(err)
	}
	call(t, ts, "POST", "/v1/ask", `{"to":"a@n2"}`, "")
	resp, err := ts.Client().Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	text := string(data)
	for _, want := range []string{
		`meshnode_members{state="alive"} 1`,
		`meshnode_members{state="dead"} 1`,
		`meshnode_tell_total{outcome="sent"} 3`,
		`meshnode_reliable_total{outcome="queued"} 5`,
		`meshnode_dedupe_hits_total 7`,
		`meshnode_outbox_depth 4`,
		`meshnode_outbox_peer_depth{peer="n2"} 4`,
		`meshnode_outbox_aimd_limit{peer="n2"} 10`,
		`meshnode_outbox_oldest_age_seconds 1`,
		`meshnode_peer_frames_total{direction="out",peer="n2"} 2`,
		`meshnode_peer_bytes_total{direction="in",peer="n2"} 3`,
		`meshnode_build_info{`,
		"go_goroutines ",
		"process_open_fds ",
		`meshnode_inbox_depth{inbox="orders"} 0`,
		"meshnode_inbox_failed 0",
		`meshnode_mailbox_depth{actor="busy"} 2`,
		`meshnode_mailbox_drops_total{actor="busy",reason="rejected"} 5`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(text, `actor="idle"`) {
		t.Error("an idle actor that never dropped is exported; 100k of them would flood the scrape")
	}
	if t.Failed() {
		t.Log(text)
	}
}

func TestConfigValidate(t *testing.T) {
	fb := &fakeBackend{}
	tests := []struct {
		name   string
		mutate func(*admin.Config)
	}{
		{"no backend", func(c *admin.Config) { c.Backend = nil }},
		{"public without token", func(c *admin.Config) { c.Addr = "0.0.0.0:1" }},
		{"ask timeout", func(c *admin.Config) { c.AskTimeout = 0 }},
		{"max body", func(c *admin.Config) { c.MaxBody = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := admin.DefaultConfig()
			cfg.Backend = fb
			tt.mutate(&cfg)
			if _, err := admin.New(cfg); !errors.Is(err, admin.ErrBadConfig) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func FuzzDecodeSendRequest(f *testing.F) {
	for _, s := range []string{`{"to":"a@b","body":{"x":[1,2,{"y":null}]}}`, `{"to":"a@b","raw":"aGk="}`, `{"to":"a@b","body":1e400}`,
		`{"to":"a@b","ttl":"-1s"}`, `{"to":1}`, `[]`, `null`, ``, `{"to":"a@b","body":"\ud800"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, msg, err := admin.DecodeSendRequest(data)
		if err != nil {
			if !errors.Is(err, admin.ErrBadRequest) {
				t.Fatalf("error %v does not wrap ErrBadRequest", err)
			}
			return
		}
		if req.To == "" || msg == nil {
			t.Fatalf("accepted a request without destination or payload: %+v", req)
		}
		if _, err := proto.Marshal(msg); err != nil {
			t.Fatalf("payload does not marshal: %v", err)
		}
		_ = admin.Render(msg)
	})
}

func BenchmarkMetricsScrape(b *testing.B) {
	ts, _, _ := newServer(b, "")
	b.ReportAllocs()
	for b.Loop() {
		resp, err := ts.Client().Get(ts.URL + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func BenchmarkDecodeSendRequest(b *testing.B) {
	data := []byte(`{"to":"orders@n2","body":{"id":42,"items":["a","b"],"total":12.5},"key":"order-42"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := admin.DecodeSendRequest(data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// Without a token the API answers only local requests: a DNS-rebound Host or
// a browser's cross-origin "simple" POST (no JSON content type) is refused.
func TestTokenlessAPIRefusesBrowserRequests(t *testing.T) {
	ts, _, _ := newServer(t, "")
	tests := []struct {
		name, host, contentType string
		status                  int
	}{
		{"local json", "", "application/json", http.StatusOK},
		{"localhost name", "localhost:7948", "application/json; charset=utf-8", http.StatusOK},
		{"rebound host", "evil.example:7948", "application/json", http.StatusForbidden},
		{"text/plain post", "", "text/plain", http.StatusUnsupportedMediaType},
		{"no content type", "", "", http.StatusUnsupportedMediaType},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/dlq/purge", strings.NewReader(`{"all":true}`))
			if tt.host != "" {
				req.Host = tt.host
			}
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
		})
	}
}

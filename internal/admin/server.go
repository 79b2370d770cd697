package admin

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/metrics"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// Server is the admin HTTP/JSON API of a daemon.
type Server struct {
	cfg       Config
	log       *slog.Logger
	mux       *http.ServeMux
	metrics   *metrics.Collector
	token     atomic.Pointer[string] // swapped by SetToken (SIGHUP)
	srv       *http.Server
	wg        sync.WaitGroup // the Serve goroutine
	closeOnce sync.Once
}

// New builds a Server; Serve starts it.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), metrics: cfg.Metrics}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.metrics == nil {
		s.metrics = metrics.New(cfg.Backend)
	}
	s.token.Store(&cfg.Token)
	s.routes()
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	return s, nil
}

// SetToken replaces the bearer token for the requests that follow (the
// daemon's reload). An empty token is refused when the API listens on a
// non-loopback address.
func (s *Server) SetToken(token string) error {
	if err := CheckAddr(s.cfg.Addr, token, s.cfg.TLS != nil); err != nil {
		return err
	}
	s.token.Store(&token)
	return nil
}

// Metrics returns the node's collector, for handlers to be instrumented.
func (s *Server) Metrics() *metrics.Collector { return s.metrics }

// Serve serves the API on l in a tracked goroutine until Close, over TLS
// when Config.TLS is set.
func (s *Server) Serve(l net.Listener) {
	if s.cfg.TLS != nil {
		l = tls.NewListener(l, s.cfg.TLS)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin API stopped", "err", err)
		}
	}()
}

// Close stops accepting, ends open requests (long polls included) and waits
// for the serving goroutine. Idempotent; it always returns nil (a request
// still open after a second is cut, not reported).
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if serr := s.srv.Shutdown(ctx); serr != nil {
			_ = s.srv.Close() // long polls still open: cut them
		}
		s.wg.Wait()
	})
	return nil
}

// ServeHTTP refuses what a browser could send on behalf of a web page,
// checks the token (or, without one, that the request really is a local
// one), then routes. The probes (/healthz, /readyz) need no token: they
// reveal nothing and supervisors rarely hold one.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz") {
		s.mux.ServeHTTP(w, r)
		return
	}
	if status, err := notFromABrowser(r); err != nil {
		writeError(w, status, err)
		return
	}
	if token := *s.token.Load(); token != "" {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			writeError(w, http.StatusUnauthorized, fmt.Errorf("%w: send the header \"Authorization: Bearer <admin_token>\" (meshnode --token)", ErrUnauthorized))
			return
		}
	} else if err := localRequest(r); err != nil {
		writeError(w, http.StatusForbidden, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBody)
	s.mux.ServeHTTP(w, r)
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /v1/members", s.members)
	s.mux.HandleFunc("POST /v1/tell", s.tell)
	s.mux.HandleFunc("POST /v1/ask", s.ask)
	s.mux.HandleFunc("POST /v1/send", s.send)
	s.mux.HandleFunc("GET /v1/outbox/stats", s.outboxStats)
	s.mux.HandleFunc("GET /v1/dlq", s.dlqList)
	s.mux.HandleFunc("POST /v1/dlq/replay", s.dlqReplay)
	s.mux.HandleFunc("POST /v1/dlq/purge", s.dlqPurge)
	s.mux.HandleFunc("GET /v1/keyring", s.keyringList)
	s.mux.HandleFunc("POST /v1/keyring", s.keyringChange)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry(), promhttp.HandlerOpts{ErrorLog: promLogger{s.log}}))
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET /version", s.version)
	if s.cfg.Pprof {
		s.mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		s.mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		s.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		s.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		s.mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	if s.cfg.Inbox != nil {
		s.mux.HandleFunc("GET /v1/inbox", s.inboxList)
		s.mux.HandleFunc("POST /v1/inbox/{name}", s.inboxDeclare)
		s.mux.HandleFunc("GET /v1/inbox/{name}/pull", s.inboxPull)
		s.mux.HandleFunc("POST /v1/inbox/{name}/ack", s.inboxAck)
	}
}

// ErrorBody is the JSON of every error response.
type ErrorBody struct {
	Error        string `json:"error"`                    // one sentence for people
	Code         string `json:"code"`                     // one of the Code* constants, for programs
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"` // capacity: when to try again
	Detail       string `json:"detail,omitempty"`         // the full error chain, for bug reports
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	body := ErrorBody{Error: Describe(err), Code: codeOf(status)}
	if full := err.Error(); full != body.Error {
		body.Detail = full
	}
	var ce *node.CapacityError
	if errors.As(err, &ce) {
		body.RetryAfterMs = ce.RetryAfter.Milliseconds()
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, (ce.RetryAfter+time.Second-1)/time.Second))))
	}
	writeJSON(w, status, body)
}

// statusOf maps an error to an HTTP status.
func statusOf(err error) int {
	var ce *node.CapacityError
	var re *node.RemoteError
	switch {
	case errors.Is(err, ErrBadRequest), errors.Is(err, node.ErrBadAddress), errors.Is(err, inbox.ErrBadName),
		errors.Is(err, outbox.ErrEmptyFilter), errors.Is(err, outbox.ErrBadRecipient), errors.Is(err, outbox.ErrExpired),
		errors.Is(err, node.ErrBadKey), errors.Is(err, node.ErrBadOption):
		return http.StatusBadRequest
	case errors.Is(err, node.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.As(err, &ce), errors.Is(err, inbox.ErrFull):
		return http.StatusTooManyRequests
	case errors.Is(err, node.ErrNoSuchActor), errors.Is(err, inbox.ErrNoSuchInbox):
		return http.StatusNotFound
	case errors.Is(err, inbox.ErrAckBeyond), errors.Is(err, inbox.ErrPullBeyond):
		return http.StatusConflict
	case errors.Is(err, node.ErrUnreachable):
		return http.StatusServiceUnavailable
	case errors.Is(err, node.ErrStoreFailed), errors.Is(err, inbox.ErrFailed):
		// Not worth retrying: the node must be restarted.
		return http.StatusInsufficientStorage
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, node.ErrOutcomeUnknown):
		// The recipient may have run it: not a plain failure to retry.
		return http.StatusGatewayTimeout
	case errors.As(err, &re):
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	st := statusOf(err)
	if st >= 500 {
		s.log.Warn("admin request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, st, err)
}

// MemberJSON is one row of GET /v1/members.
type MemberJSON struct {
	Name       string    `json:"name"`
	State      string    `json:"state"`
	GossipAddr string    `json:"gossip_addr"`
	QUICAddr   string    `json:"quic_addr"`
	BootID     string    `json:"boot_id"`
	Since      time.Time `json:"since"`
	AgeSeconds float64   `json:"age_seconds"`
}

func (s *Server) members(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	out := []MemberJSON{}
	for _, m := range s.cfg.Backend.Members() {
		out = append(out, MemberJSON{Name: m.Name, State: m.State.String(), GossipAddr: m.GossipAddr,
			QUICAddr: m.QUICAddr, BootID: m.BootID, Since: m.Since, AgeSeconds: now.Sub(m.Since).Seconds()})
	}
	writeJSON(w, http.StatusOK, map[string]any{"members": out})
}

func (s *Server) readSend(w http.ResponseWriter, r *http.Request) (SendRequest, node.Address, proto.Message, bool) {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		s.fail(w, r, fmt.Errorf("%w: read body: %w", ErrBadRequest, err))
		return SendRequest{}, node.Address{}, nil, false
	}
	req, msg, err := DecodeSendRequest(data)
	if err != nil {
		s.fail(w, r, err)
		return req, node.Address{}, nil, false
	}
	to, err := node.ParseAddress(req.To)
	if err != nil {
		s.fail(w, r, err)
		return req, node.Address{}, nil, false
	}
	return req, to, msg, true
}

func (s *Server) tell(w http.ResponseWriter, r *http.Request) {
	_, to, msg, ok := s.readSend(w, r)
	if !ok {
		return
	}
	if err := s.cfg.Backend.Tell(r.Context(), to, msg); err != nil {
		s.fail(w, r, &sendError{"tell", to, err})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true})
}

func (s *Server) ask(w http.ResponseWriter, r *http.Request) {
	req, to, msg, ok := s.readSend(w, r)
	if !ok {
		return
	}
	timeout := s.cfg.AskTimeout
	if req.Timeout != "" {
		timeout, _ = time.ParseDuration(req.Timeout) // validated by DecodeSendRequest
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	// The reply type must be known to decode it: the API's actors (inboxes)
	// reply with a Struct, and so should programs meant to be asked from here.
	reply := &structpb.Struct{}
	// The node's metrics.Calls time the ask (the daemon installs them).
	err := s.cfg.Backend.Ask(ctx, to, msg, reply)
	if err != nil {
		s.fail(w, r, &sendError{"ask", to, err})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"reply": Render(reply).Body})
}

func (s *Server) send(w http.ResponseWriter, r *http.Request) {
	req, to, msg, ok := s.readSend(w, r)
	if !ok {
		return
	}
	var opts []node.SendOption
	if req.Key != "" {
		opts = append(opts, node.WithIdempotencyKey(req.Key))
	}
	if req.Overwrite != "" {
		opts = append(opts, node.WithOverwrite(req.Overwrite))
	}
	if req.TTL != "" {
		ttl, _ := time.ParseDuration(req.TTL)
		opts = append(opts, node.WithTTL(ttl))
	}
	if len(req.Headers) > 0 {
		opts = append(opts, node.WithHeaders(req.Headers))
	}
	out, err := s.cfg.Backend.TellReliable(r.Context(), to, msg, opts...)
	if err != nil {
		s.fail(w, r, &sendError{"send", to, err})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"outcome": out.String()})
}

// OutboxStatsJSON is GET /v1/outbox/stats.
type OutboxStatsJSON struct {
	Depth            int            `json:"depth"`
	DepthByPeer      map[string]int `json:"depth_by_peer"`
	OldestAgeSeconds float64        `json:"oldest_age_seconds"`
	InFlight         int            `json:"in_flight"`
	LimitByPeer      map[string]int `json:"limit_by_peer"`
	Retries          uint64         `json:"retries"`
	DeadLettered     uint64         `json:"dead_lettered"`
	Expired          uint64         `json:"expired"`
	Delivered        uint64         `json:"delivered"`
	Enqueued         uint64         `json:"enqueued"`
	Coalesced        uint64         `json:"coalesced"`
	DLQDepth         int            `json:"dlq_depth"`
	Fsyncs           uint64         `json:"fsyncs"`
	CommitFailures   uint64         `json:"commit_failures"`
	Failure          string         `json:"failure,omitempty"` // why the outbox stopped taking writes; absent while it takes them
	StreamRestores   uint64         `json:"stream_restores"`
	StreamsForgotten uint64         `json:"streams_forgotten"`
}

func (s *Server) outboxStats(w http.ResponseWriter, r *http.Request) {
	st := s.cfg.Backend.OutboxStats()
	writeJSON(w, http.StatusOK, OutboxStatsJSON{
		Depth: st.Depth, DepthByPeer: st.DepthByPeer, OldestAgeSeconds: st.OldestAge.Seconds(), InFlight: st.InFlight,
		LimitByPeer: st.LimitByPeer, Retries: st.Retries, DeadLettered: st.DeadLettered, Expired: st.Expired,
		Delivered: st.Delivered, Enqueued: st.Enqueued, Coalesced: st.Coalesced,
		DLQDepth: st.DLQDepth, Fsyncs: st.Fsyncs, CommitFailures: st.CommitFailures, StreamRestores: st.Restores,
		StreamsForgotten: st.StreamsForgotten, Failure: st.Failure,
	})
}

// DeadLetterJSON is one row of GET /v1/dlq.
type DeadLetterJSON struct {
	ID        string    `json:"id"`
	Recipient string    `json:"recipient"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
	MsgID     string    `json:"msg_id"`
	Key       string    `json:"idempotency_key,omitempty"`
	Attempts  uint32    `json:"attempts"`
	LastError string    `json:"last_error,omitempty"`
	Rendered
}

// DLQRequest is the body of POST /v1/dlq/replay and /v1/dlq/purge.
type DLQRequest struct {
	IDs       []string `json:"ids,omitempty"`
	Recipient string   `json:"recipient,omitempty"`
	Node      string   `json:"node,omitempty"`
	Reason    string   `json:"reason,omitempty"`
	OlderThan string   `json:"older_than,omitempty"` // Go duration
	All       bool     `json:"all,omitempty"`        // required when nothing else filters
}

func (d DLQRequest) filter() (outbox.DLQFilter, error) {
	f := outbox.DLQFilter{IDs: d.IDs, Recipient: d.Recipient, Node: d.Node, Reason: d.Reason, All: d.All}
	if d.OlderThan != "" {
		v, err := time.ParseDuration(d.OlderThan)
		if err != nil || v < 0 {
			return f, fmt.Errorf("%w: older_than %q is not a duration like \"1h\"", ErrBadRequest, d.OlderThan)
		}
		f.OlderThan = v
	}
	return f, nil
}

func (s *Server) dlqList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := DLQRequest{Recipient: q.Get("recipient"), Node: q.Get("node"), Reason: q.Get("reason"), OlderThan: q.Get("older_than"), IDs: q["id"]}
	f, err := req.filter()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if l := q.Get("limit"); l != "" {
		if f.Limit, err = strconv.Atoi(l); err != nil || f.Limit < 0 {
			s.fail(w, r, fmt.Errorf("%w: limit %q is not a non-negative number", ErrBadRequest, l))
			return
		}
	}
	dls, err := s.cfg.Backend.DeadLetters(f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]DeadLetterJSON, 0, len(dls))
	for _, d := range dls {
		env := d.Message.GetEnvelope()
		out = append(out, DeadLetterJSON{ID: d.ID, Recipient: d.Recipient, Reason: d.Reason, At: d.At,
			MsgID: env.GetMsgId(), Key: env.GetIdempotencyKey(), Attempts: d.Message.GetAttempts(),
			LastError: d.Message.GetLastError(), Rendered: RenderAny(env.GetBody())})
	}
	writeJSON(w, http.StatusOK, map[string]any{"dead_letters": out})
}

func (s *Server) readDLQ(w http.ResponseWriter, r *http.Request) (outbox.DLQFilter, bool) {
	var req DLQRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		s.fail(w, r, fmt.Errorf("%w: body is not a JSON filter: %w", ErrBadRequest, err))
		return outbox.DLQFilter{}, false
	}
	f, err := req.filter()
	if err != nil {
		s.fail(w, r, err)
		return f, false
	}
	return f, true
}

func (s *Server) dlqReplay(w http.ResponseWriter, r *http.Request) {
	f, ok := s.readDLQ(w, r)
	if !ok {
		return
	}
	n, err := s.cfg.Backend.Replay(f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"replayed": n})
}

func (s *Server) dlqPurge(w http.ResponseWriter, r *http.Request) {
	f, ok := s.readDLQ(w, r)
	if !ok {
		return
	}
	n, err := s.cfg.Backend.Purge(f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"purged": n})
}

// InboxMessageJSON is one message of GET /v1/inbox/{name}/pull.
type InboxMessageJSON struct {
	Cursor    uint64            `json:"cursor"`
	MsgID     string            `json:"msg_id"`
	Key       string            `json:"idempotency_key,omitempty"`
	Sender    string            `json:"sender"`
	Type      string            `json:"type,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	CreatedAt int64             `json:"created_at_unix_ms"`
	Rendered
}

// InboxMessage renders a stored envelope.
func InboxMessage(env *pb.Envelope) InboxMessageJSON {
	return InboxMessageJSON{Cursor: env.GetEventSeq(), MsgID: env.GetMsgId(), Key: env.GetIdempotencyKey(),
		Sender: env.GetSender(), Type: env.GetType(), Headers: env.GetHeaders(), CreatedAt: env.GetCreatedAtUnixMs(),
		Rendered: RenderAny(env.GetBody())}
}

func (s *Server) inboxList(w http.ResponseWriter, r *http.Request) {
	type row struct {
		Name       string `json:"name"`
		Depth      int    `json:"depth"`
		LastCursor uint64 `json:"last_cursor"`
	}
	st := s.cfg.Inbox.Stats()
	out := []row{}
	for _, n := range sortedKeys(st) {
		out = append(out, row{Name: n, Depth: st[n].Depth, LastCursor: st[n].LastCursor})
	}
	body := map[string]any{"inboxes": out}
	if err := s.cfg.Inbox.Err(); err != nil {
		// The store stopped after a failed sync: what is listed is what it
		// held then, and nothing is taken or handed out until a restart.
		body["failure"] = err.Error()
	}
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) inboxDeclare(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	created, err := s.cfg.Inbox.Declare(name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, map[string]any{"inbox": name, "created": created})
}

func (s *Server) inboxPull(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var after uint64
	var maxN int
	var wait time.Duration
	var err error
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseUint(v, 10, 64); err != nil {
			s.fail(w, r, fmt.Errorf("%w: after %q is not a cursor (a non-negative integer)", ErrBadRequest, v))
			return
		}
	}
	if v := q.Get("max"); v != "" {
		if maxN, err = strconv.Atoi(v); err != nil || maxN < 0 {
			s.fail(w, r, fmt.Errorf("%w: max %q is not a non-negative integer", ErrBadRequest, v))
			return
		}
	}
	if v := q.Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 {
			s.fail(w, r, fmt.Errorf("%w: wait %q is not a duration like \"30s\"", ErrBadRequest, v))
			return
		}
	}
	msgs, err := s.cfg.Inbox.Pull(r.Context(), r.PathValue("name"), after, maxN, wait)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]InboxMessageJSON, 0, len(msgs))
	next := after
	for _, m := range msgs {
		out = append(out, InboxMessage(m))
		next = m.GetEventSeq()
	}
	writeJSON(w, http.StatusOK, map[string]any{"messages": out, "next_after": next})
}

// AckRequest is the body of POST /v1/inbox/{name}/ack.
type AckRequest struct {
	UpTo *uint64 `json:"up_to"`
}

func (s *Server) inboxAck(w http.ResponseWriter, r *http.Request) {
	var req AckRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.UpTo == nil {
		s.fail(w, r, fmt.Errorf("%w: body must be {\"up_to\": CURSOR}", ErrBadRequest))
		return
	}
	n, err := s.cfg.Inbox.AckUpTo(r.PathValue("name"), *req.UpTo)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"deleted": n, "acked_to": *req.UpTo})
}

// localRequest guards a token-less API against web pages in a browser on the
// same device whose requests notFromABrowser let through: a DNS-rebound
// name fails the Host check.
func localRequest(r *http.Request) error {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if !IsLoopback(host) {
		return fmt.Errorf("%w: Host %q is not a loopback address; without admin_token the API only answers local requests", ErrUnauthorized, r.Host)
	}
	return nil
}

// notFromABrowser refuses a request a web page could have made a browser
// send, with or without a token. The API serves no page, so no request
// of its own comes from any origin:
//
//   - a request with an Origin header, or with a Sec-Fetch-Site other than
//     "none" (typed or bookmarked), was made by a page: refused (403);
//   - a request that changes state (any method but GET, HEAD, OPTIONS)
//     must say Content-Type: application/json, even without a body: a
//     page can send a cross-origin "simple" POST only with a form or text
//     type, and a JSON one needs a CORS preflight this server never
//     answers (415).
func notFromABrowser(r *http.Request) (int, error) {
	if o := r.Header.Get("Origin"); o != "" {
		return http.StatusForbidden, fmt.Errorf("%w: request from the web page at %q refused: the admin API answers programs, not pages", ErrUnauthorized, o)
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "none" {
		return http.StatusForbidden, fmt.Errorf("%w: a %s request from a web page refused: the admin API answers programs, not pages", ErrUnauthorized, site)
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return 0, nil
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		return http.StatusUnsupportedMediaType, fmt.Errorf("%w: a %s must be sent with Content-Type: application/json, also without a body", ErrBadRequest, r.Method)
	}
	return 0, nil
}

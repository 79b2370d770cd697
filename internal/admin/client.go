package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client talks to a daemon's admin API with the server's own types, so a
// renamed field breaks its users at compile time. The CLI and testnet's
// process clusters use it.
type Client struct {
	base    string
	token   string
	timeout time.Duration
	hc      *http.Client
}

// maxResponse bounds what is read of one answer.
const maxResponse = 64 << 20

// ErrBadResponse: an answer that is not the JSON expected.
var ErrBadResponse = errors.New("admin: bad response")

// APIError is a non-2xx answer: its HTTP status and the daemon's error body.
type APIError struct {
	Status int
	ErrorBody
}

func (e *APIError) Error() string {
	if e.ErrorBody.Error == "" {
		return fmt.Sprintf("admin: the daemon answered %d %s", e.Status, http.StatusText(e.Status))
	}
	return e.ErrorBody.Error
}

// NewClient returns a client of the daemon at addr ("host:port" or a URL)
// with token ("" for none). timeout bounds each request beyond the time it
// asks the daemon to wait (a long poll, an ask's deadline).
func NewClient(addr, token string, timeout time.Duration) *Client {
	base := addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return &Client{base: strings.TrimSuffix(base, "/"), token: token, timeout: timeout, hc: &http.Client{}}
}

// Base returns the daemon's base URL.
func (c *Client) Base() string { return c.base }

// Timeout returns the per-request timeout.
func (c *Client) Timeout() time.Duration { return c.timeout }

// Do sends one request (in, when not nil, as JSON) and decodes a 2xx JSON
// answer into out (nil: ignore it). A non-2xx answer is an *APIError. wait
// is how long the request asks the daemon to wait; the request gives up
// after wait plus the client's timeout, with the context's error.
func (c *Client) Do(ctx context.Context, method, path string, in, out any, wait time.Duration) error {
	var rd io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("admin: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, wait+c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return fmt.Errorf("admin: address %q: %w", c.base, err)
	}
	if in != nil || method != http.MethodGet {
		// Also without a body: the daemon refuses a state change that
		// does not say JSON (a browser's cross-origin form could send one).
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return err
	}
	return DecodeResponse(resp.StatusCode, data, out)
}

// DecodeResponse turns an answer into out or an error. It is the one
// decoder of the daemon's answers and never panics (FuzzDecodeResponse).
func DecodeResponse(status int, data []byte, out any) error {
	if status < 200 || status > 299 {
		e := &APIError{Status: status}
		if json.Unmarshal(data, &e.ErrorBody) != nil || e.ErrorBody.Error == "" {
			// Not the daemon's error body (a proxy's page, say): keep the
			// start of what came.
			e.ErrorBody = ErrorBody{Error: strings.TrimSpace(string(truncate(data, 200)))}
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%w: %w: %q", ErrBadResponse, err, truncate(data, 200))
	}
	return nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// WithHTTPClient returns a copy of c that sends through hc (a custom
// dialer, say).
func (c *Client) WithHTTPClient(hc *http.Client) *Client {
	cp := *c
	cp.hc = hc
	return &cp
}

// Members is GET /v1/members.
func (c *Client) Members(ctx context.Context) ([]MemberJSON, error) {
	var out struct {
		Members []MemberJSON `json:"members"`
	}
	err := c.Do(ctx, http.MethodGet, "/v1/members", nil, &out, 0)
	return out.Members, err
}

// Send is POST /v1/send; it returns the outcome ("Delivered", "Queued" or
// "DeadLettered").
func (c *Client) Send(ctx context.Context, req SendRequest) (string, error) {
	var out struct {
		Outcome string `json:"outcome"`
	}
	err := c.Do(ctx, http.MethodPost, "/v1/send", req, &out, 0)
	return out.Outcome, err
}

// OutboxStats is GET /v1/outbox/stats.
func (c *Client) OutboxStats(ctx context.Context) (OutboxStatsJSON, error) {
	var out OutboxStatsJSON
	err := c.Do(ctx, http.MethodGet, "/v1/outbox/stats", nil, &out, 0)
	return out, err
}

// DeclareInbox is POST /v1/inbox/{name} (idempotent).
func (c *Client) DeclareInbox(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodPost, "/v1/inbox/"+url.PathEscape(name), struct{}{}, nil, 0)
}

// Pull is GET /v1/inbox/{name}/pull: up to max messages after cursor
// after, waiting up to wait for the first; next is the cursor to pull
// after next time.
func (c *Client) Pull(ctx context.Context, name string, after uint64, max int, wait time.Duration) (msgs []InboxMessageJSON, next uint64, err error) {
	var out struct {
		Messages  []InboxMessageJSON `json:"messages"`
		NextAfter uint64             `json:"next_after"`
	}
	path := fmt.Sprintf("/v1/inbox/%s/pull?after=%d&max=%d", url.PathEscape(name), after, max)
	if wait > 0 {
		path += "&wait=" + url.QueryEscape(wait.String())
	}
	err = c.Do(ctx, http.MethodGet, path, nil, &out, wait)
	return out.Messages, out.NextAfter, err
}

// Ack is POST /v1/inbox/{name}/ack: it deletes the messages up to and
// including cursor upTo and returns how many.
func (c *Client) Ack(ctx context.Context, name string, upTo uint64) (int, error) {
	var out struct {
		Deleted int `json:"deleted"`
	}
	err := c.Do(ctx, http.MethodPost, "/v1/inbox/"+url.PathEscape(name)+"/ack", AckRequest{UpTo: &upTo}, &out, 0)
	return out.Deleted, err
}

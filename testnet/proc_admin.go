package testnet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// maxAdminResponse bounds what is read of one admin API answer.
const maxAdminResponse = 64 << 20

// ProcMember is one row of a daemon's GET /v1/members.
type ProcMember struct {
	Name       string `json:"name"`
	State      string `json:"state"`
	GossipAddr string `json:"gossip_addr"`
	QUICAddr   string `json:"quic_addr"`
	BootID     string `json:"boot_id"`
}

// InboxMessage is one message of a daemon's inbox pull.
type InboxMessage struct {
	Cursor    uint64            `json:"cursor"`
	MsgID     string            `json:"msg_id"`
	Key       string            `json:"idempotency_key"`
	Sender    string            `json:"sender"`
	Headers   map[string]string `json:"headers"`
	CreatedAt int64             `json:"created_at_unix_ms"`
	Body      json.RawMessage   `json:"body"`
	Raw       []byte            `json:"raw"`
	BodyType  string            `json:"body_type"`
}

// ProcOutboxStats is the part of GET /v1/outbox/stats the harness uses.
type ProcOutboxStats struct {
	Depth        int    `json:"depth"`
	InFlight     int    `json:"in_flight"`
	DLQDepth     int    `json:"dlq_depth"`
	Delivered    uint64 `json:"delivered"`
	Enqueued     uint64 `json:"enqueued"`
	DeadLettered uint64 `json:"dead_lettered"`
}

// do sends one request to daemon i's admin API and decodes a 2xx JSON
// answer into out; any other answer is an *AdminError.
func (c *ProcCluster) do(ctx context.Context, i int, method, path string, in, out any) error {
	p, err := c.get(i)
	if err != nil {
		return err
	}
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("testnet: %s %s on %s: encode: %w", method, path, p.name, err)
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+p.admin+path, body)
	if err != nil {
		return fmt.Errorf("testnet: %s %s on %s: %w", method, path, p.name, err)
	}
	if in != nil || method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("testnet: %s %s on %s: %w", method, path, p.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminResponse))
	if err != nil {
		return fmt.Errorf("testnet: %s %s on %s: read: %w", method, path, p.name, err)
	}
	if err := decodeAdmin(resp.StatusCode, data, out); err != nil {
		return fmt.Errorf("testnet: %s %s on %s: %w", method, path, p.name, err)
	}
	return nil
}

// decodeAdmin turns an admin API answer into out or an error. It is the
// one decoder of bytes from the daemons and never panics (FuzzDecodeAdmin).
func decodeAdmin(status int, data []byte, out any) error {
	if status < 200 || status > 299 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			e.Error = string(truncate(data, 200))
		}
		return &AdminError{Status: status, Message: e.Error}
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

func (c *ProcCluster) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.opts.adminTimeout)
}

// Send makes a reliable send (POST /v1/send) from daemon i to to
// ("actor@node") with a JSON body (marshalled with encoding/json; a
// json.RawMessage is sent as is) and an idempotency key ("" for none). It
// returns the outcome the daemon reported: "Delivered" or "Queued".
func (c *ProcCluster) Send(i int, to string, body any, key string) (outcome string, err error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return "", fmt.Errorf("testnet: send: body: %w", err)
	}
	ctx, cancel := c.ctx()
	defer cancel()
	var out struct {
		Outcome string `json:"outcome"`
	}
	req := struct {
		To   string          `json:"to"`
		Body json.RawMessage `json:"body"`
		Key  string          `json:"key,omitempty"`
	}{to, raw, key}
	if err := c.do(ctx, i, http.MethodPost, "/v1/send", req, &out); err != nil {
		return "", err
	}
	if out.Outcome != "Delivered" && out.Outcome != "Queued" {
		return "", fmt.Errorf("testnet: send on %s: %w: outcome %q", c.Name(i), ErrBadResponse, out.Outcome)
	}
	return out.Outcome, nil
}

// Declare declares an inbox on daemon i (idempotent).
func (c *ProcCluster) Declare(i int, inbox string) error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.do(ctx, i, http.MethodPost, "/v1/inbox/"+url.PathEscape(inbox), nil, nil)
}

// Pull returns up to max messages of daemon i's inbox after cursor after,
// without waiting.
func (c *ProcCluster) Pull(i int, inbox string, after uint64, max int) ([]InboxMessage, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	var out struct {
		Messages []InboxMessage `json:"messages"`
	}
	path := fmt.Sprintf("/v1/inbox/%s/pull?after=%d&max=%d", url.PathEscape(inbox), after, max)
	if err := c.do(ctx, i, http.MethodGet, path, nil, &out); err != nil {
		return nil, err
	}
	return out.Messages, nil
}

// Ack acknowledges (deletes) daemon i's inbox messages up to and including
// cursor upTo, and returns how many were deleted.
func (c *ProcCluster) Ack(i int, inbox string, upTo uint64) (int, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	var out struct {
		Deleted int `json:"deleted"`
	}
	in := struct {
		UpTo uint64 `json:"up_to"`
	}{upTo}
	if err := c.do(ctx, i, http.MethodPost, "/v1/inbox/"+url.PathEscape(inbox)+"/ack", in, &out); err != nil {
		return 0, err
	}
	return out.Deleted, nil
}

// Members returns daemon i's view of the cluster.
func (c *ProcCluster) Members(i int) ([]ProcMember, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	var out struct {
		Members []ProcMember `json:"members"`
	}
	if err := c.do(ctx, i, http.MethodGet, "/v1/members", nil, &out); err != nil {
		return nil, err
	}
	return out.Members, nil
}

// OutboxStats returns daemon i's outbox statistics.
func (c *ProcCluster) OutboxStats(i int) (ProcOutboxStats, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	var out ProcOutboxStats
	err := c.do(ctx, i, http.MethodGet, "/v1/outbox/stats", nil, &out)
	return out, err
}

// alive returns the names daemon i reports alive.
func (c *ProcCluster) alive(i int) (map[string]bool, error) {
	ms, err := c.Members(i)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool)
	for _, m := range ms {
		if m.State == "alive" {
			out[m.Name] = true
		}
	}
	return out, nil
}

// running returns the indexes of running daemons.
func (c *ProcCluster) running() []int {
	var out []int
	for i := range c.Len() {
		if c.Running(i) {
			out = append(out, i)
		}
	}
	return out
}

// poll calls cond every 50 ms until it returns true, ctx ends or a daemon
// that should run has exited. The last reason cond gave is in the error.
func (c *ProcCluster) poll(ctx context.Context, what string, cond func() (bool, string)) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	last := ""
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("testnet: %s: %w (last: %s)", what, ctx.Err(), last)
		case <-t.C:
		}
	}
}

// waitAdmin waits until daemon i's admin API answers; a daemon that exits
// meanwhile is an error wrapping ErrProcExited.
func (c *ProcCluster) waitAdmin(ctx context.Context, i int) error {
	name := c.Name(i)
	err := c.poll(ctx, name+" admin API up", func() (bool, string) {
		if !c.Running(i) {
			return false, "exited"
		}
		_, err := c.Members(i)
		return err == nil, fmt.Sprint(err)
	})
	if !c.Running(i) {
		return fmt.Errorf("testnet: %s: %w during start; its log:\n%s", name, ErrProcExited, c.Logs(i))
	}
	return err
}

// WaitConverged waits until every running daemon reports exactly the
// running daemons as alive members. A daemon that exits meanwhile ends
// the wait with an error wrapping ErrProcExited.
func (c *ProcCluster) WaitConverged(ctx context.Context) error {
	exited := -1
	err := c.poll(ctx, "converge", func() (bool, string) {
		c.mu.Lock()
		for i, p := range c.procs {
			if p.done != nil {
				select {
				case <-p.done:
					exited = i
				default:
				}
			}
		}
		c.mu.Unlock()
		if exited >= 0 {
			return true, ""
		}
		run := c.running()
		want := make(map[string]bool, len(run))
		for _, i := range run {
			want[c.Name(i)] = true
		}
		for _, i := range run {
			got, err := c.alive(i)
			if err != nil {
				return false, err.Error()
			}
			if len(got) != len(want) {
				return false, fmt.Sprintf("%s sees %d alive, want %d", c.Name(i), len(got), len(want))
			}
			for n := range want {
				if !got[n] {
					return false, fmt.Sprintf("%s does not see %s alive", c.Name(i), n)
				}
			}
		}
		return true, ""
	})
	if exited >= 0 {
		return fmt.Errorf("testnet: %s: %w; its log:\n%s", c.Name(exited), ErrProcExited, c.Logs(exited))
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotConverged, err)
	}
	return nil
}

// WaitDrained waits until no running daemon has messages waiting or in
// flight in its outbox.
func (c *ProcCluster) WaitDrained(ctx context.Context) error {
	return c.poll(ctx, "outboxes drained", func() (bool, string) {
		for _, i := range c.running() {
			st, err := c.OutboxStats(i)
			if err != nil {
				return false, err.Error()
			}
			if st.Depth != 0 || st.InFlight != 0 {
				return false, fmt.Sprintf("%s: depth %d, in flight %d", c.Name(i), st.Depth, st.InFlight)
			}
		}
		return true, ""
	})
}

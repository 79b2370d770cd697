package testnet

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
)

// The admin API's own types: a renamed field breaks testnet at compile
// time, not at run time.
type (
	// ProcMember is one row of a daemon's GET /v1/members.
	ProcMember = admin.MemberJSON
	// InboxMessage is one message of a daemon's inbox pull.
	InboxMessage = admin.InboxMessageJSON
	// ProcOutboxStats is a daemon's GET /v1/outbox/stats.
	ProcOutboxStats = admin.OutboxStatsJSON
	// AdminError is a non-2xx answer of a daemon's admin API.
	AdminError = admin.APIError
)

// ErrBadResponse: an admin API answer that is not the JSON expected.
var ErrBadResponse = admin.ErrBadResponse

// adminOf returns the admin API client of daemon i.
func (c *ProcCluster) adminOf(i int) (*admin.Client, string, error) {
	p, err := c.get(i)
	if err != nil {
		return nil, "", err
	}
	return admin.NewClient(p.admin, "", c.opts.adminTimeout).WithHTTPClient(p.client), p.name, nil
}

// call runs f with daemon i's client and names the daemon in its error.
func (c *ProcCluster) call(i int, what string, f func(ctx context.Context, ac *admin.Client) error) error {
	ac, name, err := c.adminOf(i)
	if err != nil {
		return err
	}
	ctx, cancel := c.ctx()
	defer cancel()
	if err := f(ctx, ac); err != nil {
		return fmt.Errorf("testnet: %s on %s: %w", what, name, err)
	}
	return nil
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
	err = c.call(i, "send", func(ctx context.Context, ac *admin.Client) error {
		outcome, err = ac.Send(ctx, admin.SendRequest{To: to, Body: raw, Key: key})
		return err
	})
	if err == nil && outcome != "Delivered" && outcome != "Queued" {
		return "", fmt.Errorf("testnet: send on %s: %w: outcome %q", c.Name(i), ErrBadResponse, outcome)
	}
	return outcome, err
}

// Declare declares an inbox on daemon i (idempotent).
func (c *ProcCluster) Declare(i int, inbox string) error {
	return c.call(i, "declare "+inbox, func(ctx context.Context, ac *admin.Client) error { return ac.DeclareInbox(ctx, inbox) })
}

// Pull returns up to max messages of daemon i's inbox after cursor after,
// without waiting.
func (c *ProcCluster) Pull(i int, inbox string, after uint64, max int) (msgs []InboxMessage, err error) {
	err = c.call(i, "pull "+inbox, func(ctx context.Context, ac *admin.Client) error {
		msgs, _, err = ac.Pull(ctx, inbox, after, max, 0)
		return err
	})
	return msgs, err
}

// Ack acknowledges (deletes) daemon i's inbox messages up to and including
// cursor upTo, and returns how many were deleted.
func (c *ProcCluster) Ack(i int, inbox string, upTo uint64) (n int, err error) {
	err = c.call(i, "ack "+inbox, func(ctx context.Context, ac *admin.Client) error {
		n, err = ac.Ack(ctx, inbox, upTo)
		return err
	})
	return n, err
}

// Members returns daemon i's view of the cluster.
func (c *ProcCluster) Members(i int) (ms []ProcMember, err error) {
	err = c.call(i, "members", func(ctx context.Context, ac *admin.Client) error {
		ms, err = ac.Members(ctx)
		return err
	})
	return ms, err
}

// OutboxStats returns daemon i's outbox statistics.
func (c *ProcCluster) OutboxStats(i int) (st ProcOutboxStats, err error) {
	err = c.call(i, "outbox stats", func(ctx context.Context, ac *admin.Client) error {
		st, err = ac.OutboxStats(ctx)
		return err
	})
	return st, err
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

package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// What a node needs from the transport to carry envelopes through another
// member, and to find out when the direct path is back.

// Certificate returns the certificate (with its private key) this node
// presents now: the one forwarded envelopes are signed with.
func (t *Transport) Certificate() *tls.Certificate { return t.certs.Current() }

// Roots returns the cluster CA roots the transport verifies peers against.
func (t *Transport) Roots() *x509.CertPool { return t.cfg.Identity.Roots }

// Forward queues env, which asks for a receipt, on the connection to node
// and calls done exactly once, from another goroutine, with its receipt or
// with why none came (the connection was lost, timeout passed, the
// transport closed). It never blocks, so a Handler may call it: without a
// live connection to node it starts a dial in the background and returns
// an error wrapping ErrUnreachable at once (a later call finds the
// connection). Envelopes forwarded for one recipient keep their order.
// When it returns an error, done is not called.
func (t *Transport) Forward(node string, env *pb.Envelope, timeout time.Duration, done func(*pb.Receipt, error)) error {
	if env.GetMsgId() == "" || env.GetReceipt() == pb.Envelope_RECEIPT_NONE {
		return fmt.Errorf("transport: forward to %s: %w: no msg id or no receipt asked", node, ErrBadEnvelope)
	}
	// env goes exactly as it is: its sender added what each sending adds
	// (and kept room for it when it accepted the message), so no room is
	// kept here; that would refuse the largest messages a sender accepts.
	if err := t.CheckSendTo(env, node); err != nil {
		return fmt.Errorf("transport: forward to %s: %w", node, err)
	}
	c, err := t.connNow(node)
	if err != nil {
		return err
	}
	envs := []*pb.Envelope{env}
	ws, got := newWaiters(1)
	if err := c.addWaiters(envs, ws); err != nil {
		return fmt.Errorf("transport: forward to %s: %w", node, err)
	}
	if err := c.laneFor(env.GetRecipient()).enqueueEnvelopes(envs); err != nil {
		c.removeWaiters(envs, ws)
		return fmt.Errorf("transport: forward to %s: %w", node, err)
	}
	w := ws[0]
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		select {
		case <-got:
			if w.err != nil {
				done(nil, fmt.Errorf("transport: forward %q to %s: %w", env.GetMsgId(), node, w.err))
				return
			}
			done(w.rc, nil)
		case <-timer.C:
			c.removeWaiters(envs, ws)
			done(nil, fmt.Errorf("transport: forward %q to %s: %w: no receipt within %v", env.GetMsgId(), node, ErrConnLost, timeout))
		case <-t.ctx.Done():
			c.removeWaiters(envs, ws)
			done(nil, ErrClosed)
		}
	}()
	return nil
}

// connNow returns the live connection to node, or starts one dial in the
// background and returns ErrUnreachable.
func (t *Transport) connNow(node string) (*conn, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	p := t.peerLocked(node)
	if c := p.conn; c != nil && !c.isClosed() {
		t.mu.Unlock()
		return c, nil
	}
	dialing := p.dialing != nil
	t.mu.Unlock()
	if _, busy := t.bgDials.LoadOrStore(node, struct{}{}); !dialing && !busy {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer t.bgDials.Delete(node)
			ctx, cancel := context.WithTimeout(t.ctx, t.cfg.HandshakeTimeout)
			defer cancel()
			if _, err := t.connFor(ctx, node); err != nil {
				t.log.Debug("background dial failed", "peer", node, "err", err)
			}
		}()
	} else if !busy {
		t.bgDials.Delete(node)
	}
	return nil, fmt.Errorf("transport: forward to %s: %w: no connection yet (dialing)", node, ErrUnreachable)
}

// Redial dials a new connection to node now, whatever connection it has,
// and makes it the current one when its handshake succeeds: a probe for a
// caller with reason to think the current path leads nowhere. It returns
// nil once a handshake with node completed, bounded by ctx and
// HandshakeTimeout; a connection it replaces fails its waiters with
// ErrConnLost.
func (t *Transport) Redial(ctx context.Context, node string) error {
	addr, err := t.r.Resolve(node)
	if err != nil {
		return fmt.Errorf("transport: redial %s: %w: %w", node, ErrUnreachable, err)
	}
	if t.ctx.Err() != nil {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	stop := context.AfterFunc(t.ctx, cancel)
	defer stop()
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return fmt.Errorf("transport: redial %s at %s: %w: %w", node, addr, ErrUnreachable, err)
	}
	tc := t.clientTLS.Clone()
	tc.ServerName = node
	qc, err := t.qt.Dial(ctx, ua, tc, t.qconf)
	if err != nil {
		if t.ctx.Err() != nil {
			return ErrClosed
		}
		return fmt.Errorf("transport: redial %s at %s: %w: %w", node, addr, ErrUnreachable, err)
	}
	if _, err := t.setup(ctx, qc, true, node); err != nil && !errors.Is(err, errDuplicate) {
		if t.ctx.Err() != nil {
			return ErrClosed
		}
		return fmt.Errorf("transport: redial %s at %s: %w: %w", node, addr, ErrUnreachable, err)
	}
	return nil
}

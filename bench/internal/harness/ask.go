package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/node"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// askPhase measures sequential round trips: meshnode Ask, NATS
// request-reply and a raw quic-go echo, each replying with the payload.
func (e *env) askPhase() ([]Row, error) {
	payload := make([]byte, e.cfg.Payload)
	m50, m99, err := e.meshAsk(payload)
	if err != nil {
		return nil, err
	}
	e.cfg.logf("ask: meshnode p50 %v p99 %v", m50, m99)
	n50, n99, err := e.natsRequest(payload)
	if err != nil {
		return nil, err
	}
	e.cfg.logf("ask: NATS p50 %v p99 %v", n50, n99)
	q50, q99, err := e.rawEcho(payload)
	if err != nil {
		return nil, err
	}
	e.cfg.logf("ask: raw quic-go p50 %v p99 %v", q50, q99)
	row := func(phase string, m, c time.Duration, name, target string) Row {
		r := Row{Phase: phase, Meshnode: Figure{Value: micros(m), Unit: "µs"},
			Comparison: &Figure{Name: name, Value: micros(c), Unit: "µs"}, Ratio: ratio(micros(m), micros(c)), Target: target}
		if target != "" {
			r.Met = yesNo(r.Ratio <= 1.0)
		}
		return r
	}
	note := fmt.Sprintf("%d sequential round trips", e.cfg.Asks)
	rows := []Row{
		row("ask p50 vs NATS request-reply", m50, n50, "NATS request-reply", "≤ 1.0×"),
		row("ask p99 vs NATS request-reply", m99, n99, "NATS request-reply", "≤ 1.0×"),
		row("ask p50 vs raw quic-go echo", m50, q50, "raw quic-go echo", ""),
		row("ask p99 vs raw quic-go echo", m99, q99, "raw quic-go echo", ""),
	}
	rows[0].Note = note
	return rows, nil
}

func (e *env) meshAsk(payload []byte) (p50, p99 time.Duration, err error) {
	a, b, err := e.pair("ask")
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = a.Close(); _ = b.Close() }()
	reply := wrapperspb.Bytes(payload)
	to, err := b.Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		return reply, nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("bench: ask: spawn: %w", err)
	}
	req := wrapperspb.Bytes(payload)
	var resp wrapperspb.BytesValue
	ctx := context.Background()
	return latencies(e.cfg, "meshnode ask", func() error {
		if err := a.Ask(ctx, to, req, &resp); err != nil {
			return err
		}
		if len(resp.GetValue()) != len(payload) {
			return fmt.Errorf("bench: ask: reply has %d bytes, want %d", len(resp.GetValue()), len(payload))
		}
		return nil
	})
}

func (e *env) natsRequest(payload []byte) (p50, p99 time.Duration, err error) {
	ns, err := e.startNATS(false, false, "nats-req")
	if err != nil {
		return 0, 0, err
	}
	defer ns.close()
	req, err := ns.connect()
	if err != nil {
		return 0, 0, err
	}
	defer req.Close()
	rep, err := ns.connect()
	if err != nil {
		return 0, 0, err
	}
	defer rep.Close()
	if _, err := rep.Subscribe("bench.ask", func(m *nats.Msg) { _ = m.Respond(payload) }); err != nil {
		return 0, 0, fmt.Errorf("bench: nats subscribe: %w", err)
	}
	if err := rep.Flush(); err != nil {
		return 0, 0, fmt.Errorf("bench: nats flush: %w", err)
	}
	return latencies(e.cfg, "NATS request-reply", func() error {
		m, err := req.Request("bench.ask", payload, 10*time.Second)
		if err != nil {
			return err
		}
		if len(m.Data) != len(payload) {
			return fmt.Errorf("bench: nats reply has %d bytes, want %d", len(m.Data), len(payload))
		}
		return nil
	})
}

func (e *env) rawEcho(payload []byte) (p50, p99 time.Duration, err error) {
	rs, err := e.startRawServer(true, nil)
	if err != nil {
		return 0, 0, err
	}
	defer rs.close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := e.dialRaw(ctx, rs.addr())
	if err != nil {
		return 0, 0, err
	}
	defer c.close()
	return latencies(e.cfg, "raw quic-go echo", func() error { return c.roundTrip(payload) })
}

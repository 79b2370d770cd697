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

// askPhase measures sequential round trips (meshnode Ask, NATS
// request-reply and a raw quic-go echo, each replying with the payload),
// then the round trips per second of cfg.Askers concurrent askers sharing
// one connection and one replier (meshnode and NATS), in cfg.Rounds
// rounds that take turns; each row reports the medians over the rounds.
func (e *env) askPhase() ([]Row, error) {
	payload := make([]byte, e.cfg.Payload)
	var ms, ns []askFigures
	var q50s, q99s []float64
	for round := range e.cfg.Rounds {
		m, err := e.meshAsk(payload, round == 0)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("ask: meshnode p50 %v p99 %v; %d askers %.0f/s", m.p50, m.p99, e.cfg.Askers, m.rate)
		n, err := e.natsRequest(payload)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("ask: NATS p50 %v p99 %v; %d askers %.0f/s", n.p50, n.p99, e.cfg.Askers, n.rate)
		q50, q99, err := e.rawEcho(payload)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("ask: raw quic-go p50 %v p99 %v", q50, q99)
		ms, ns = append(ms, m), append(ns, n)
		q50s, q99s = append(q50s, micros(q50)), append(q99s, micros(q99))
	}
	// each picks one figure of every round, in µs or asks/s.
	each := func(fs []askFigures, pick func(askFigures) float64) []float64 {
		v := make([]float64, len(fs))
		for i, f := range fs {
			v[i] = pick(f)
		}
		return v
	}
	p50 := func(f askFigures) float64 { return micros(f.p50) }
	p99 := func(f askFigures) float64 { return micros(f.p99) }
	row := func(phase string, m, c []float64, name, target string) Row {
		r := Row{Phase: phase, Meshnode: Figure{Value: median(m), Unit: "µs"},
			Comparison: &Figure{Name: name, Value: median(c), Unit: "µs"}, Ratio: ratio(median(m), median(c)),
			Target: target, Note: roundsNote(m, c)}
		if target != "" {
			r.Met = yesNo(r.Ratio <= 1.0)
		}
		return r
	}
	rows := []Row{
		row("ask p50 vs NATS request-reply", each(ms, p50), each(ns, p50), "NATS request-reply", "≤ 1.0×"),
		row("ask p99 vs NATS request-reply", each(ms, p99), each(ns, p99), "NATS request-reply", "≤ 1.0×"),
		row("ask p50 vs raw quic-go echo", each(ms, p50), q50s, "raw quic-go echo", ""),
		row("ask p99 vs raw quic-go echo", each(ms, p99), q99s, "raw quic-go echo", ""),
	}
	rows[0].Note = joinNotes(rows[0].Note, fmt.Sprintf("%d sequential round trips per round", e.cfg.Asks))
	rate := func(f askFigures) float64 { return f.rate }
	cp50 := func(f askFigures) float64 { return micros(f.cp50) }
	cp99 := func(f askFigures) float64 { return micros(f.cp99) }
	mr, nr := each(ms, rate), each(ns, rate)
	concurrent := Row{
		Phase:      fmt.Sprintf("ask throughput, %d concurrent askers vs NATS request-reply", e.cfg.Askers),
		Meshnode:   Figure{Value: median(mr), Unit: "asks/s"},
		Comparison: &Figure{Name: "NATS request-reply", Value: median(nr), Unit: "asks/s"},
		Ratio:      ratio(median(mr), median(nr)),
		Target:     "≥ 1.0×",
		Note: joinNotes(roundsNote(mr, nr), fmt.Sprintf("one connection, one replier; p50 / p99 under load: meshnode %.1f / %.1f µs, NATS %.1f / %.1f µs",
			median(each(ms, cp50)), median(each(ms, cp99)), median(each(ns, cp50)), median(each(ns, cp99)))),
	}
	concurrent.Met = yesNo(concurrent.Ratio >= 1.0)
	return append(rows, concurrent), nil
}

// askFigures are one system's ask measurements: sequential latencies, and
// the rate and latencies of cfg.Askers concurrent askers.
type askFigures struct {
	p50, p99   time.Duration
	rate       float64
	cp50, cp99 time.Duration
}

// measureAsks takes both measurements of askFigures; newRT returns a
// round trip that one goroutine may call repeatedly.
// measureAsks measures sequential round trips, then concurrent ones; with
// profile set, -profiles writes the concurrent measurement as ask.pprof.
func (e *env) measureAsks(what string, profile bool, newRT func() func() error) (f askFigures, err error) {
	if f.p50, f.p99, err = latencies(e.cfg, what, newRT()); err != nil {
		return f, err
	}
	stop := func() {}
	if profile {
		if stop, err = e.profile("ask"); err != nil {
			return f, err
		}
	}
	f.rate, f.cp50, f.cp99, err = concurrentRoundTrips(e.cfg, what, e.cfg.Askers, newRT)
	stop()
	return f, err
}

// meshAsk: n1 asks an echo actor on n2. With profile set, its concurrent
// measurement is the one -profiles writes.
func (e *env) meshAsk(payload []byte, profile bool) (askFigures, error) {
	a, b, err := e.pair("ask")
	if err != nil {
		return askFigures{}, err
	}
	defer func() { _ = a.Close(); _ = b.Close() }()
	reply := wrapperspb.Bytes(payload)
	to, err := b.Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		return reply, nil
	})
	if err != nil {
		return askFigures{}, fmt.Errorf("bench: ask: spawn: %w", err)
	}
	req := wrapperspb.Bytes(payload)
	ctx := context.Background()
	return e.measureAsks("meshnode ask", profile, func() func() error {
		var resp wrapperspb.BytesValue
		return func() error {
			if err := a.Ask(ctx, to, req, &resp); err != nil {
				return err
			}
			if len(resp.GetValue()) != len(payload) {
				return fmt.Errorf("bench: ask: reply has %d bytes, want %d", len(resp.GetValue()), len(payload))
			}
			return nil
		}
	})
}

func (e *env) natsRequest(payload []byte) (askFigures, error) {
	ns, err := e.startNATS(false, false, "nats-req")
	if err != nil {
		return askFigures{}, err
	}
	defer ns.close()
	req, err := ns.connect()
	if err != nil {
		return askFigures{}, err
	}
	defer req.Close()
	rep, err := ns.connect()
	if err != nil {
		return askFigures{}, err
	}
	defer rep.Close()
	if _, err := rep.Subscribe("bench.ask", func(m *nats.Msg) { _ = m.Respond(payload) }); err != nil {
		return askFigures{}, fmt.Errorf("bench: nats subscribe: %w", err)
	}
	if err := rep.Flush(); err != nil {
		return askFigures{}, fmt.Errorf("bench: nats flush: %w", err)
	}
	return e.measureAsks("NATS request-reply", false, func() func() error {
		return func() error {
			m, err := req.Request("bench.ask", payload, 10*time.Second)
			if err != nil {
				return err
			}
			if len(m.Data) != len(payload) {
				return fmt.Errorf("bench: nats reply has %d bytes, want %d", len(m.Data), len(payload))
			}
			return nil
		}
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

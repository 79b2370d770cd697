package harness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// tellPhase measures one-way throughput: meshnode Tell between two nodes,
// NATS core pub→sub, and a raw quic-go framed stream, in cfg.Rounds rounds
// that take turns; each row reports the medians over the rounds.
func (e *env) tellPhase() ([]Row, error) {
	payload := make([]byte, e.cfg.Payload)
	var mesh, nrate, qrate, srate []float64
	var mcpu, ncpu, qcpu, scpu []float64 // CPU per message, ns
	var note string
	frame := 0
	for r := range e.cfg.Rounds {
		m, n, fb, mc, err := e.meshTell(payload, r == 0)
		if err != nil {
			return nil, err
		}
		if r == 0 {
			frame = fb
		}
		e.cfg.logf("tell: meshnode %.0f msgs/s", m)
		nr, nc, err := e.natsPubSub(payload)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("tell: NATS %.0f msgs/s", nr)
		qr, qc, err := e.rawStream(payload)
		if err != nil {
			return nil, err
		}
		e.cfg.logf("tell: raw quic-go %.0f msgs/s", qr)
		mcpu, ncpu, qcpu = append(mcpu, mc), append(ncpu, nc), append(qcpu, qc)
		// The same stream with frames of a tell's size on the wire (its
		// envelope: ids, addresses, the body's type): what quic-go costs
		// for the bytes a tell sends, apart from meshnode's own work.
		if frame > len(payload) {
			sr, sc, err := e.rawStream(make([]byte, frame-rawPrefix(frame)))
			if err != nil {
				return nil, err
			}
			e.cfg.logf("tell: raw quic-go, %d-B frames: %.0f msgs/s", frame, sr)
			srate, scpu = append(srate, sr), append(scpu, sc)
		}
		mesh, nrate, qrate = append(mesh, m), append(nrate, nr), append(qrate, qr)
		if r == 0 {
			note = n
		}
	}
	m := Figure{Value: median(mesh), Unit: "msgs/s"}
	rn, rq := ratio(m.Value, median(nrate)), ratio(m.Value, median(qrate))
	return []Row{
		{Phase: "tell vs NATS pub→sub", Meshnode: m, Comparison: &Figure{Name: "NATS core pub→sub", Value: median(nrate), Unit: "msgs/s"},
			Ratio: rn, Target: "≥ 1.0×", Met: yesNo(rn >= 1.0), Note: joinNotes(roundsNote(mesh, nrate), note, cpuNote(mcpu, ncpu, "NATS (its server too)"))},
		{Phase: "tell vs raw quic-go stream", Meshnode: m, Comparison: &Figure{Name: "raw quic-go stream", Value: median(qrate), Unit: "msgs/s"},
			Ratio: rq, Target: "≥ 0.5×", Met: yesNo(rq >= 0.5), Note: joinNotes(roundsNote(mesh, qrate), sameSizeNote(frame, mesh, srate, scpu), cpuNote(mcpu, qcpu, "the raw stream"))},
	}, nil
}

// cpuNote gives the CPU a message took from its send to its receipt
// (the process's: both ends run in it), medians over the rounds, of
// meshnode and of the comparison.
func cpuNote(mesh, other []float64, name string) string {
	return fmt.Sprintf("CPU per message, both ends: meshnode %.0f ns, %s %.0f ns", median(mesh), name, median(other))
}

// sameSizeNote says how Tell compares with the raw stream carrying frames
// of a tell's size on the wire (frame bytes, length prefix included).
func sameSizeNote(frame int, mesh, srate, scpu []float64) string {
	if len(srate) == 0 {
		return ""
	}
	return fmt.Sprintf("with %d-B frames, a tell's size on the wire, the raw stream carries %.0f msgs/s (%.0f ns of CPU per message): %.2f×", frame, median(srate), median(scpu), ratio(median(mesh), median(srate)))
}

// rawPrefix is the size of the raw stream's varint length prefix in a
// frame of n bytes.
func rawPrefix(n int) int {
	p := 1
	for v := n - 1; v >= 0x80; v >>= 7 {
		p++
	}
	return p
}

// isCapacity reports whether err is back-pressure (a full queue or mailbox).
func isCapacity(err error) (time.Duration, bool) {
	var ce *node.CapacityError
	if errors.As(err, &ce) {
		return ce.RetryAfter, true
	}
	return 0, false
}

// meshTell: n1 tells a counting actor on n2. Back-pressure from the
// connection's bounded queue is honoured by waiting RetryAfter; drops at the
// receiver's mailbox are counted as lost and reported. With profile set,
// the measurement is the one -profiles writes. It also returns the mean
// size of the frames n1 sent (a tell's size on the wire).
func (e *env) meshTell(payload []byte, profile bool) (rate float64, note string, frame int, cpu float64, err error) {
	a, b, err := e.pair("tell")
	if err != nil {
		return 0, "", 0, 0, err
	}
	defer func() { _ = a.Close(); _ = b.Close() }()
	var s sink
	to, err := b.Spawn("count", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		s.hit()
		return nil, nil
	}, node.WithMailbox(1<<16, mailbox.Reject))
	if err != nil {
		return 0, "", 0, 0, fmt.Errorf("bench: tell: spawn: %w", err)
	}
	msg := wrapperspb.Bytes(payload)
	ctx := context.Background()
	var retries int64
	send := func() error {
		for {
			err := a.Tell(ctx, to, msg)
			if err == nil {
				return nil
			}
			wait, ok := isCapacity(err)
			if !ok {
				return err
			}
			retries++
			time.Sleep(min(wait, time.Millisecond))
		}
	}
	lost := func() int64 { st := b.Stats(); return int64(st.Dropped + st.RefusedFull) }
	// Warm-up: connection setup is not part of the figure.
	if err := send(); err != nil {
		return 0, "", 0, 0, fmt.Errorf("bench: tell: warm-up: %w", err)
	}
	if err := waitFor(10*time.Second, "warm-up tell received", func() bool { return s.n.Load() == 1 }); err != nil {
		return 0, "", 0, 0, err
	}
	s.n.Store(0)
	stop := func() {}
	if profile {
		if stop, err = e.profile("tell"); err != nil {
			return 0, "", 0, 0, err
		}
	}
	rate, sent, cpu, err := throughputCPU(e.cfg, "meshnode tell", send, nil, &s, lost)
	stop()
	if err != nil {
		return 0, "", 0, 0, err
	}
	note = fmt.Sprintf("%d sent", sent)
	if l := lost(); l > 0 {
		note += fmt.Sprintf(", %d dropped at the receiver", l)
	}
	if retries > 0 {
		note += fmt.Sprintf(", %d queue-full retries", retries)
	}
	var frames, bytes uint64
	for _, ps := range a.PeerStats() {
		frames, bytes = frames+ps.FramesOut, bytes+ps.BytesOut
	}
	if frames > 0 {
		frame = int(bytes / frames)
	}
	return rate, note, frame, cpu, nil
}

// natsPubSub: one publisher connection, one subscriber connection counting.
func (e *env) natsPubSub(payload []byte) (rate, cpu float64, err error) {
	ns, err := e.startNATS(false, false, "nats-pubsub")
	if err != nil {
		return 0, 0, err
	}
	defer ns.close()
	pub, err := ns.connect()
	if err != nil {
		return 0, 0, err
	}
	defer pub.Close()
	subc, err := ns.connect()
	if err != nil {
		return 0, 0, err
	}
	defer subc.Close()
	var s sink
	sub, err := subc.Subscribe("bench.tell", func(*nats.Msg) { s.hit() })
	if err != nil {
		return 0, 0, fmt.Errorf("bench: nats subscribe: %w", err)
	}
	// No client-side slow-consumer drops: the subscriber must count all.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return 0, 0, fmt.Errorf("bench: nats pending limits: %w", err)
	}
	if err := subc.Flush(); err != nil {
		return 0, 0, fmt.Errorf("bench: nats flush: %w", err)
	}
	lost := func() int64 { d, _ := sub.Dropped(); return int64(d) }
	rate, _, cpu, err = throughputCPU(e.cfg, "NATS pub→sub",
		func() error { return pub.Publish("bench.tell", payload) },
		pub.Flush, &s, lost)
	return rate, cpu, err
}

// rawStream: one quic-go stream, varint-framed payloads, batched by a
// 64 KiB bufio.Writer; the receiver counts frames.
func (e *env) rawStream(payload []byte) (rate, cpu float64, err error) {
	var s sink
	rs, err := e.startRawServer(false, &s)
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
	rate, _, cpu, err = throughputCPU(e.cfg, "raw quic-go stream", func() error { return c.send(payload) }, c.flush, &s, nil)
	return rate, cpu, err
}

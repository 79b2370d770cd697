package harness

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// CurvePayloads are the payload sizes of the curves phase.
var CurvePayloads = []int{16, 128, 1 << 10, 64 << 10, 1 << 20}

// curveBytes bounds the bytes one curve point sends (or queues, for a
// drain): big payloads get fewer messages, so a point never holds more
// than this in queues and mailboxes.
const curveBytes = 256 << 20

// curveTimeout bounds the wait for one point's receiver; a point that
// does not finish is reported with a zero figure instead of failing the
// run (NATS disconnects a subscriber it judges slow).
const curveTimeout = 30 * time.Second

// Point is one point of a curve.
type Point struct {
	Series  string  `json:"series"`  // "meshnode tell s=8", "NATS pub→sub s=8", "meshnode drain"
	Payload int     `json:"payload"` // bytes
	Rate    float64 `json:"rate"`    // msgs/s; 0 = the point did not finish
	Note    string  `json:"note,omitempty"`
}

// curvesPhase measures Tell (meshnode and NATS pub→sub) at each senders
// level and payload size, and the drain of a backlog into an in-process
// actor at each payload size, as informational rows; the points also go
// to Report.Curves (meshbench -curves DIR draws them).
func (e *env) curvesPhase() ([]Row, error) {
	var rows []Row
	for _, p := range CurvePayloads {
		for _, s := range e.cfg.Senders {
			mp, mnote, err := e.curveMeshTell(p, s)
			if err != nil {
				return nil, err
			}
			np, nnote, err := e.curveNATS(p, s)
			if err != nil {
				return nil, err
			}
			e.cfg.logf("curves: tell %d B s=%d: meshnode %.0f (%s), NATS %.0f (%s)", p, s, mp, mnote, np, nnote)
			e.points = append(e.points,
				Point{Series: fmt.Sprintf("meshnode tell s=%d", s), Payload: p, Rate: mp, Note: mnote},
				Point{Series: fmt.Sprintf("NATS pub→sub s=%d", s), Payload: p, Rate: np, Note: nnote})
			rows = append(rows, Row{Phase: fmt.Sprintf("curve tell %d B s=%d", p, s), Meshnode: Figure{Value: mp, Unit: "msgs/s"},
				Comparison: &Figure{Name: "NATS pub→sub", Value: np, Unit: "msgs/s"}, Ratio: ratio(mp, np),
				Note: "informational; " + mnote})
		}
	}
	// The drain's "senders" are streams: the backlog spread round-robin
	// over that many recipient actors on the returning node, each its own
	// stream with its own emission in flight.
	for _, p := range CurvePayloads {
		for _, k := range e.cfg.Senders {
			sub := e.sub(p)
			d, err := sub.drainInto(fmt.Sprintf("curve-drain-%d-%d", p, k), fmt.Sprintf("curve drain %d B streams=%d", p, k), k, spawnCounter)
			if err != nil {
				return nil, err
			}
			d[0].Target, d[0].Met = "", ""
			d[0].Note = fmt.Sprintf("informational, backlog %d over %d streams; %s", sub.cfg.Backlog, k, strings.TrimSuffix(d[0].Note, drainSizeNote))
			e.cfg.logf("curves: drain %d B streams=%d: %.0f msgs/s", p, k, d[0].Meshnode.Value)
			e.points = append(e.points, Point{Series: fmt.Sprintf("meshnode drain streams=%d", k), Payload: p, Rate: d[0].Meshnode.Value})
			rows = append(rows, d...)
		}
	}
	return rows, nil
}

// sub returns a copy of e for one payload size: at most curveBytes queued.
func (e *env) sub(payload int) *env {
	c := *e
	c.cfg.Payload = payload
	c.cfg.Backlog = max(1, min(e.cfg.Backlog, curveBytes/payload))
	c.cfg.N = max(1, min(e.cfg.N, curveBytes/payload))
	c.cfg.Timeout = curveTimeout
	return &c
}

// throughputN runs senders goroutines calling send until cfg.N messages
// in all or cfg.Duration, then waits until the receiver counted them all
// (or lost accounts for the rest): msgs/s received, first send to last
// receive.
func throughputN(cfg Config, senders int, send func(i int) error, flush func() error, s *sink, lost func() int64) (float64, error) {
	var next, sent atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	start := time.Now()
	for i := 0; i < senders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(cfg.N) && time.Since(start) < cfg.Duration {
				if err := send(i); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				sent.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	if flush != nil {
		if err := flush(); err != nil {
			return 0, err
		}
	}
	if err := waitFor(cfg.Timeout, "all messages received", func() bool { return s.n.Load()+lost() >= sent.Load() }); err != nil {
		return 0, err
	}
	elapsed := time.Duration(s.last.Load() - start.UnixNano())
	if elapsed <= 0 {
		elapsed = time.Since(start)
	}
	return float64(s.n.Load()) / elapsed.Seconds(), nil
}

// curveMeshTell: senders goroutines on n1 tell a counting actor on n2.
func (e *env) curveMeshTell(payload, senders int) (float64, string, error) {
	c := e.sub(payload)
	a, b, err := c.pair(fmt.Sprintf("curve-tell-%d-%d", payload, senders))
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = a.Close(); _ = b.Close() }()
	var s sink
	to, err := b.Spawn("count", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		s.hit()
		return nil, nil
	}, node.WithMailbox(min(1<<16, curveBytes/payload), mailbox.Reject)) // as the tell phase's, bounded in bytes
	if err != nil {
		return 0, "", fmt.Errorf("bench: curves: spawn: %w", err)
	}
	msg := wrapperspb.Bytes(make([]byte, payload))
	ctx := context.Background()
	send := func(int) error {
		for {
			err := a.Tell(ctx, to, msg)
			if err == nil {
				return nil
			}
			wait, ok := isCapacity(err)
			if !ok {
				return err
			}
			// As the error asks: for large payloads it is the send
			// queue's estimate of when the message fits.
			time.Sleep(wait)
		}
	}
	if err := send(0); err != nil {
		return 0, "", fmt.Errorf("bench: curves: warm-up: %w", err)
	}
	if err := waitFor(10*time.Second, "warm-up tell received", func() bool { return s.n.Load() == 1 }); err != nil {
		return 0, "", err
	}
	s.n.Store(0)
	lost := func() int64 { st := b.Stats(); return int64(st.Dropped + st.RefusedFull) }
	rate, err := throughputN(c.cfg, senders, send, nil, &s, lost)
	if err != nil {
		return 0, "did not finish: " + err.Error(), nil
	}
	note := ""
	if l := lost(); l > 0 {
		note = fmt.Sprintf("%d dropped at the receiver", l)
	}
	return rate, note, nil
}

// curveNATS: senders publisher connections, one subscriber connection.
func (e *env) curveNATS(payload, senders int) (float64, string, error) {
	c := e.sub(payload)
	ns, err := c.startNATS(false, false, fmt.Sprintf("curve-nats-%d-%d", payload, senders))
	if err != nil {
		return 0, "", err
	}
	defer ns.close()
	subc, err := ns.connect()
	if err != nil {
		return 0, "", err
	}
	defer subc.Close()
	var s sink
	sub, err := subc.Subscribe("bench.curve", func(*nats.Msg) { s.hit() })
	if err != nil {
		return 0, "", fmt.Errorf("bench: nats subscribe: %w", err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return 0, "", fmt.Errorf("bench: nats pending limits: %w", err)
	}
	if err := subc.Flush(); err != nil {
		return 0, "", fmt.Errorf("bench: nats flush: %w", err)
	}
	pubs := make([]*nats.Conn, senders)
	for i := range pubs {
		if pubs[i], err = ns.connect(); err != nil {
			return 0, "", err
		}
		defer pubs[i].Close()
	}
	data := make([]byte, payload)
	send := func(i int) error { return pubs[i].Publish("bench.curve", data) }
	lost := func() int64 { d, _ := sub.Dropped(); return int64(d) }
	flush := func() error {
		for _, p := range pubs {
			if err := p.Flush(); err != nil {
				return fmt.Errorf("bench: nats flush: %w", err)
			}
		}
		return nil
	}
	rate, err := throughputN(c.cfg, senders, send, flush, &s, lost)
	if err != nil {
		return 0, "did not finish: " + err.Error(), nil
	}
	return rate, "", nil
}

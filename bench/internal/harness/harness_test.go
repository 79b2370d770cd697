package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/node"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) {
	MaybeChild() // the rss phase re-executes the test binary as its child
	goleak.VerifyTestMain(m)
}

// tinyConfig runs every phase at a size that takes a second or two.
func tinyConfig(tb testing.TB) Config {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.N = 3000
	cfg.Duration = 300 * time.Millisecond
	cfg.Asks = 50
	cfg.Askers = 8
	cfg.Rounds = 2
	cfg.Senders = []int{1, 4}
	cfg.Backlog = 3000
	cfg.Actors = 2000
	cfg.WorkDir = tb.TempDir()
	cfg.Timeout = 30 * time.Second
	if testing.Verbose() {
		cfg.Progress = os.Stderr
	}
	return cfg
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"default", func(*Config) {}, true},
		{"zero payload", func(c *Config) { c.Payload = 0 }, false},
		{"huge payload", func(c *Config) { c.Payload = 2 << 20 }, false},
		{"zero n", func(c *Config) { c.N = 0 }, false},
		{"zero duration", func(c *Config) { c.Duration = 0 }, false},
		{"zero asks", func(c *Config) { c.Asks = 0 }, false},
		{"no senders", func(c *Config) { c.Senders = nil }, false},
		{"negative senders", func(c *Config) { c.Senders = []int{1, -1} }, false},
		{"zero askers", func(c *Config) { c.Askers = 0 }, false},
		{"zero rounds", func(c *Config) { c.Rounds = 0 }, false},
		{"too many rounds", func(c *Config) { c.Rounds = 101 }, false},
		{"zero backlog", func(c *Config) { c.Backlog = 0 }, false},
		{"zero actors", func(c *Config) { c.Actors = 0 }, false},
		{"no workdir", func(c *Config) { c.WorkDir = "" }, false},
		{"zero timeout", func(c *Config) { c.Timeout = 0 }, false},
		{"unknown phase", func(c *Config) { c.Only = []string{"tell", "warp"} }, false},
		{"known phases", func(c *Config) { c.Only = []string{"tell", "rss"} }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.edit(&cfg)
			err := cfg.Validate()
			if tt.ok && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if !tt.ok && !errors.Is(err, ErrBadConfig) {
				t.Fatalf("Validate = %v, want ErrBadConfig", err)
			}
		})
	}
	if _, err := Run(Config{}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("Run(zero config) = %v, want ErrBadConfig", err)
	}
}

// TestRunEveryPhase runs the whole harness at a tiny size and checks that
// every phase produced plausible figures, the table and the JSON.
func TestRunEveryPhase(t *testing.T) {
	cfg := tinyConfig(t)
	rep, err := Run(cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := map[string]int{ // phase prefix -> rows expected
		"tell vs":                 2,
		"ask p":                   4,
		"ask throughput":          1,
		"bbolt commit latency":    1,
		"tell-reliable offline s": 2*4 + 1 + 1, // four per level, the N-record bound for s>1, one recipient per sender
		"tell-reliable pipelined": 2,           // vs JetStream async, default sync and sync-always
		"drain":                   2,           // into an in-process actor and into a daemon inbox
		"RSS with":                1,
		"memory per idle actor":   1,
		"receiver state per":      1,
	}
	for prefix, n := range want {
		got := 0
		for _, r := range rep.Rows {
			if strings.HasPrefix(r.Phase, prefix) {
				got++
			}
		}
		if got != n {
			t.Errorf("%d rows start with %q, want %d", got, prefix, n)
		}
	}
	for _, r := range rep.Rows {
		if !(r.Meshnode.Value > 0) {
			t.Errorf("%s: meshnode figure %v, want > 0", r.Phase, r.Meshnode.Value)
		}
		if r.Comparison != nil && !(r.Comparison.Value > 0 && r.Ratio > 0) {
			t.Errorf("%s: comparison %v ratio %v, want > 0", r.Phase, r.Comparison.Value, r.Ratio)
		}
		if r.Target != "" && r.Met == "" {
			t.Errorf("%s: target %q without a verdict", r.Phase, r.Target)
		}
		if (strings.HasPrefix(r.Phase, "tell vs") || strings.HasPrefix(r.Phase, "ask ")) &&
			!strings.Contains(r.Note, "median of 2 interleaved rounds") {
			t.Errorf("%s: note %q does not say its figures are medians of the rounds", r.Phase, r.Note)
		}
	}
	var tbl bytes.Buffer
	if err := rep.WriteTable(&tbl); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tbl.String(), "phase") || !strings.Contains(tbl.String(), "met?") ||
		strings.Count(tbl.String(), "\n") != len(rep.Rows)+2 {
		t.Errorf("table:\n%s", tbl.String())
	}
	path := filepath.Join(t.TempDir(), "out.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("JSON does not decode: %v", err)
	}
	if len(back.Rows) != len(rep.Rows) || back.Machine.CPUs < 1 {
		t.Errorf("JSON has %d rows and %d CPUs, want %d rows", len(back.Rows), back.Machine.CPUs, len(rep.Rows))
	}
	if entries, _ := os.ReadDir(cfg.WorkDir); len(entries) != 0 {
		t.Errorf("work directory not cleaned: %d entries left", len(entries))
	}
}

func TestRunOnly(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Only = []string{PhaseActors}
	rep, err := Run(cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(rep.Rows) != 2 || !strings.HasPrefix(rep.Rows[0].Phase, "memory per idle actor") ||
		!strings.HasPrefix(rep.Rows[1].Phase, "receiver state per stream") {
		t.Fatalf("rows = %+v, want only the actors phase's two rows", rep.Rows)
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      int
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"p50 of 4", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of 100", ms(seq(100)...), 99, 99 * time.Millisecond},
		{"p100", ms(1, 2, 3), 100, 3 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.sorted, tt.p); got != tt.want {
				t.Fatalf("percentile = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMedianAndRoundsNote(t *testing.T) {
	for _, tt := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{5}, 5}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		in := slices.Clone(tt.xs)
		if got := median(in); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.xs, got, tt.want)
		}
		if !slices.Equal(in, tt.xs) {
			t.Errorf("median reordered its input: %v, was %v", in, tt.xs)
		}
	}
	if got := roundsNote([]float64{1}, []float64{2}); got != "" {
		t.Errorf("one round: note %q, want none", got)
	}
	want := "median of 3 interleaved rounds (each round's ratio: 0.50× 2.00× 1.00×)"
	if got := roundsNote([]float64{1, 4, 3}, []float64{2, 2, 3}); got != want {
		t.Errorf("roundsNote = %q, want %q", got, want)
	}
	if got := joinNotes("", "a", "", "b"); got != "a; b" {
		t.Errorf("joinNotes = %q, want %q", got, "a; b")
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

func TestReadFrame(t *testing.T) {
	huge := binary.AppendUvarint(nil, 1<<40)
	tests := []struct {
		name string
		in   []byte
		want []byte
		err  error
	}{
		{"ok", appendFrame(nil, []byte("hello")), []byte("hello"), nil},
		{"empty frame", appendFrame(nil, nil), []byte{}, nil},
		{"too large", append(huge, 1, 2, 3), nil, ErrFrameTooLarge},
		{"truncated body", appendFrame(nil, []byte("hello"))[:4], nil, io.ErrUnexpectedEOF},
		{"no length", nil, nil, io.EOF},
		{"overlong varint", bytes.Repeat([]byte{0xff}, 11), nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readFrame(bufio.NewReader(bytes.NewReader(tt.in)), 1024, nil)
			switch {
			case tt.want != nil:
				if err != nil || !bytes.Equal(got, tt.want) {
					t.Fatalf("readFrame = %q, %v; want %q", got, err, tt.want)
				}
			case tt.err != nil:
				if !errors.Is(err, tt.err) {
					t.Fatalf("readFrame error = %v, want %v", err, tt.err)
				}
			default:
				if err == nil {
					t.Fatalf("readFrame accepted %x", tt.in)
				}
			}
		})
	}
}

// FuzzReadFrame: arbitrary bytes never panic or pass the size limit, and a
// frame that decodes is exactly the bytes after its length prefix.
func FuzzReadFrame(f *testing.F) {
	f.Add(appendFrame(nil, []byte("payload")))
	f.Add(appendFrame(appendFrame(nil, []byte("a")), make([]byte, 128)))
	f.Add(binary.AppendUvarint(nil, 1<<40))
	f.Add([]byte{0x80, 0x00})
	f.Add([]byte{0x80})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		src := bytes.NewReader(in)
		r := bufio.NewReaderSize(src, 16)
		off := 0
		for {
			got, err := readFrame(r, 256, nil)
			if err != nil {
				return
			}
			if len(got) > 256 {
				t.Fatalf("frame of %d bytes passed a 256-byte limit", len(got))
			}
			consumed := len(in) - src.Len() - r.Buffered()
			body := in[consumed-len(got) : consumed]
			if !bytes.Equal(got, body) {
				t.Fatalf("frame %x, want the input bytes %x", got, body)
			}
			n, k := binary.Uvarint(in[off : consumed-len(got)])
			if k != consumed-len(got)-off || n != uint64(len(got)) {
				t.Fatalf("prefix %x does not encode length %d", in[off:consumed-len(got)], len(got))
			}
			off = consumed
		}
	})
}

// BenchmarkRawFrame: encode and decode of the raw comparison's framing, so
// the ceiling is not limited by the harness's own code.
func BenchmarkRawFrame(b *testing.B) {
	payload := make([]byte, 128)
	var stream bytes.Buffer
	for i := 0; i < 1024; i++ {
		stream.Write(appendFrame(nil, payload))
	}
	data := stream.Bytes()
	src := bytes.NewReader(data)
	r := bufio.NewReaderSize(src, 64<<10)
	var buf, out []byte
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%1024 == 0 {
			src.Reset(data)
			r.Reset(src)
		}
		out = appendFrame(out[:0], payload)
		var err error
		if buf, err = readFrame(r, maxRawFrame, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// A drain spread over several streams delivers the whole backlog, every
// actor its share.
func TestDrainOverStreams(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Backlog = 1024
	e, err := newEnv(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	per := map[string]int{}
	rows, err := e.drainInto("streams", "drain over streams", 4, func(rcv *node.Node, name string, s *sink, first *int64) (func(), error) {
		_, err := rcv.Spawn(name, func(ctx context.Context, m *node.Message) (proto.Message, error) {
			mu.Lock()
			per[name]++
			mu.Unlock()
			atomic.CompareAndSwapInt64(first, 0, time.Now().UnixNano())
			s.hit()
			return nil, nil
		})
		return nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || !(rows[0].Meshnode.Value > 0) {
		t.Fatalf("rows %+v", rows)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(per) != 4 {
		t.Fatalf("messages per actor %v, want 4 actors", per)
	}
	for name, n := range per {
		if n != 256 {
			t.Fatalf("messages per actor %v, want 256 each (%s)", per, name)
		}
	}
}

// throughputCPU charges each message the process CPU spent from the first
// send to the last receipt: sends that each burn at least 200 µs of CPU
// cost at least that much a message.
func TestThroughputCPUPerMessage(t *testing.T) {
	var s sink
	burn := func() error {
		for start := processCPU(); processCPU()-start < 200*time.Microsecond; {
		}
		s.hit()
		return nil
	}
	cfg := Config{N: 50, Duration: time.Minute, Timeout: time.Minute}
	_, sent, cpu, err := throughputCPU(cfg, "burn", burn, nil, &s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sent != 50 || cpu < 200_000 {
		t.Fatalf("%d sent, %.0f ns of CPU a message; want 50 and at least 200000", sent, cpu)
	}
}

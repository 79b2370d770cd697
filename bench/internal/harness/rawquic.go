package harness

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/quic-go/quic-go"
)

// The raw quic-go comparison: one bidirectional stream with TLS 1.3 carrying
// frames of a varint length and the payload, the transport's ceiling.

const rawALPN = "meshbench-raw"

// maxRawFrame bounds a raw frame; a larger length is refused before allocating.
const maxRawFrame = 1 << 20

// appendFrame appends a varint length and p to dst.
func appendFrame(dst, p []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(p)))
	return append(dst, p...)
}

// readFrame reads one frame into buf (grown if needed) and returns it. A
// length above max is ErrFrameTooLarge, refused before allocating; a short
// frame is io.ErrUnexpectedEOF. It never panics on any input.
func readFrame(r *bufio.Reader, max int, buf []byte) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, fmt.Errorf("bench: read frame length: %w", err)
	}
	if n > uint64(max) {
		return nil, fmt.Errorf("bench: read frame: length %d > %d: %w", n, max, ErrFrameTooLarge)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("bench: read frame body: %w", err)
	}
	return buf, nil
}

// rawServer accepts raw QUIC connections; each stream either counts frames
// (mode count) or echoes them (mode echo).
type rawServer struct {
	ln   *quic.Listener
	echo bool
	sink *sink
	wg   sync.WaitGroup

	// mu guards the field below.
	mu    sync.Mutex
	conns []*quic.Conn
}

func (e *env) rawTLS(name string, server bool) (*tls.Config, error) {
	id, err := e.ca.NewIdentity(name)
	if err != nil {
		return nil, fmt.Errorf("bench: raw identity %s: %w", name, err)
	}
	c := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.Cert},
		NextProtos:   []string{rawALPN},
	}
	if server {
		c.ClientCAs = id.Roots
		c.ClientAuth = tls.RequireAndVerifyClientCert
	} else {
		c.RootCAs = id.Roots
		c.ServerName = "raw-server"
	}
	return c, nil
}

func (e *env) startRawServer(echo bool, s *sink) (*rawServer, error) {
	tc, err := e.rawTLS("raw-server", true)
	if err != nil {
		return nil, err
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", tc, &quic.Config{})
	if err != nil {
		return nil, fmt.Errorf("bench: raw listen: %w", err)
	}
	rs := &rawServer{ln: ln, echo: echo, sink: s}
	rs.wg.Add(1)
	go rs.accept()
	return rs, nil
}

func (rs *rawServer) addr() string { return rs.ln.Addr().String() }

func (rs *rawServer) accept() {
	defer rs.wg.Done()
	for {
		conn, err := rs.ln.Accept(context.Background())
		if err != nil {
			return // listener closed
		}
		rs.mu.Lock()
		rs.conns = append(rs.conns, conn)
		rs.mu.Unlock()
		rs.wg.Add(1)
		go rs.serve(conn)
	}
}

func (rs *rawServer) serve(conn *quic.Conn) {
	defer rs.wg.Done()
	st, err := conn.AcceptStream(context.Background())
	if err != nil {
		return
	}
	r := bufio.NewReaderSize(st, 64<<10)
	w := bufio.NewWriterSize(st, 64<<10)
	var buf []byte
	for {
		buf, err = readFrame(r, maxRawFrame, buf)
		if err != nil {
			st.CancelRead(0)
			_ = st.Close()
			return
		}
		if !rs.echo {
			rs.sink.hit()
			continue
		}
		if _, err := w.Write(appendFrame(nil, buf)); err != nil {
			return
		}
		// Flush only when no further request is already buffered: a
		// pipelining client gets batched writes, a sequential one no delay.
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

func (rs *rawServer) close() {
	_ = rs.ln.Close()
	rs.mu.Lock()
	for _, c := range rs.conns {
		_ = c.CloseWithError(0, "bench done")
	}
	rs.mu.Unlock()
	rs.wg.Wait()
}

// rawClient is one connection with one stream to a rawServer.
type rawClient struct {
	conn *quic.Conn
	st   *quic.Stream
	r    *bufio.Reader
	w    *bufio.Writer
	buf  []byte
	out  []byte
}

func (e *env) dialRaw(ctx context.Context, addr string) (*rawClient, error) {
	tc, err := e.rawTLS("raw-client", false)
	if err != nil {
		return nil, err
	}
	conn, err := quic.DialAddr(ctx, addr, tc, &quic.Config{})
	if err != nil {
		return nil, fmt.Errorf("bench: raw dial: %w", err)
	}
	st, err := conn.OpenStreamSync(ctx)
	if err != nil {
		_ = conn.CloseWithError(0, "")
		return nil, fmt.Errorf("bench: raw open stream: %w", err)
	}
	return &rawClient{conn: conn, st: st, r: bufio.NewReaderSize(st, 64<<10), w: bufio.NewWriterSize(st, 64<<10)}, nil
}

// send buffers one frame; the bufio.Writer batches frames into few writes,
// as the transport's lane writer does.
func (c *rawClient) send(p []byte) error {
	c.out = appendFrame(c.out[:0], p)
	_, err := c.w.Write(c.out)
	return err
}

func (c *rawClient) flush() error { return c.w.Flush() }

// roundTrip sends p and waits for its echo.
func (c *rawClient) roundTrip(p []byte) error {
	if err := c.send(p); err != nil {
		return err
	}
	if err := c.w.Flush(); err != nil {
		return err
	}
	var err error
	c.buf, err = readFrame(c.r, maxRawFrame, c.buf)
	if err != nil {
		return err
	}
	if len(c.buf) != len(p) {
		return fmt.Errorf("bench: raw echo: got %d bytes, want %d", len(c.buf), len(p))
	}
	return nil
}

func (c *rawClient) close() {
	_ = c.st.Close()
	_ = c.conn.CloseWithError(0, "bench done")
}

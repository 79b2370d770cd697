package transport_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"github.com/quic-go/quic-go"
)

// The receiver learns the sender's outbox id from the Hello: it is the
// sender part of every reliable stream.
func TestPeerInfoCarriesOutboxID(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	rec := &recorder{}
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	startNode(t, testConfig(t, ca, "b"), r, rec)
	if _, err := a.Request(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	_, from := rec.snapshot()
	if len(from) != 1 || from[0].OutboxID != a.cfg.OutboxID || from[0].Name != "a" {
		t.Fatalf("from = %+v, want a with outbox id %x", from, a.cfg.OutboxID)
	}
}

// One envelope too large for a frame must not sink its batch: the
// transport reports which one and sends the others.
func TestRequestBatchReportsUnsendableAndSendsTheRest(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	cfg := testConfig(t, ca, "a")
	cfg.MaxFrameSize = 4096
	a := startNode(t, cfg, r, &recorder{})
	bcfg := testConfig(t, ca, "b")
	bcfg.MaxFrameSize = 4096
	rec := &recorder{}
	startNode(t, bcfg, r, rec)
	envs := []*pb.Envelope{
		envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED),
		envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED),
		envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED),
		envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED),
	}
	envs[2].Type = strings.Repeat("X", 8192)
	if err := a.CheckSize(envs[2]); !errors.Is(err, transport.ErrFrameTooLarge) {
		t.Fatalf("CheckSize(big) = %v, want ErrFrameTooLarge", err)
	}
	if err := a.CheckSize(envs[0]); err != nil {
		t.Fatalf("CheckSize(small) = %v", err)
	}
	rcs, err := a.RequestBatch(ctxT(t, 5*time.Second), "b", envs)
	var ee *transport.EncodeError
	if !errors.As(err, &ee) || len(ee.Errs) != 1 || ee.Errs[2] == nil || !errors.Is(ee.Errs[2], transport.ErrFrameTooLarge) {
		t.Fatalf("err = %v, want an EncodeError for envelope 2 only", err)
	}
	for i, rc := range rcs {
		if (rc == nil) != (i == 2) {
			t.Fatalf("receipt %d = %v; want receipts for every envelope but 2", i, rc)
		}
	}
	if got, _ := rec.snapshot(); len(got) != 3 {
		t.Fatalf("receiver got %d envelopes, want 3", len(got))
	}
}

// A peer of the previous protocol is refused with a reason that says what
// to do, whether it offers the old application protocol or an old Hello.
func TestOldProtocolRefusedClearly(t *testing.T) {
	t.Run("hello", func(t *testing.T) {
		ca := newCA(t)
		r := newResolver()
		old := testConfig(t, ca, "old")
		transport.SetHelloHook(&old, func(h *pb.Hello) { h.ProtocolVersions = []uint32{1} })
		o := startNode(t, old, r, &recorder{})
		k := startNode(t, testConfig(t, ca, "new"), r, &recorder{})
		err := o.Send(ctxT(t, 5*time.Second), "new", envTo(t, "x@new", pb.Envelope_RECEIPT_NONE))
		if !errors.Is(err, transport.ErrIncompatible) || !strings.Contains(err.Error(), "same meshnode release") {
			t.Fatalf("err = %v, want ErrIncompatible saying what to do", err)
		}
		testutil.WaitFor(t, 2*time.Second, "refusal logged", func() bool {
			return strings.Contains(k.logs.String(), "protocol versions [1]")
		})
	})
	t.Run("alpn", func(t *testing.T) {
		ca := newCA(t)
		r := newResolver()
		k := startNode(t, testConfig(t, ca, "new"), r, &recorder{})
		id, err := ca.NewIdentity("old")
		if err != nil {
			t.Fatal(err)
		}
		tc := &tls.Config{Certificates: []tls.Certificate{id.Cert}, RootCAs: id.Roots, ServerName: "new",
			NextProtos: []string{"meshnode/1"}, MinVersion: tls.VersionTLS13}
		ctx := ctxT(t, 5*time.Second)
		qc, err := quic.DialAddr(ctx, k.LocalAddr().String(), tc, &quic.Config{MaxIdleTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = qc.CloseWithError(0, "") }()
		<-qc.Context().Done()
		var ae *quic.ApplicationError
		if cause := context.Cause(qc.Context()); !errors.As(cause, &ae) || ae.ErrorCode != transport.CodeIncompatible ||
			!strings.Contains(ae.ErrorMessage, "same meshnode release") {
			t.Fatalf("close = %v, want CodeIncompatible with what to do", cause)
		}
	})
}

// A renewed certificate is presented on new connections without a
// restart; one for another name is refused and the old one kept.
func TestReloadCertificate(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	k := startNode(t, testConfig(t, ca, "srv"), r, &recorder{})
	presented := func() string {
		t.Helper()
		id, err := ca.NewIdentity("probe")
		if err != nil {
			t.Fatal(err)
		}
		tc := &tls.Config{Certificates: []tls.Certificate{id.Cert}, RootCAs: id.Roots, ServerName: "srv",
			NextProtos: []string{transport.ALPN}, MinVersion: tls.VersionTLS13}
		qc, err := quic.DialAddr(ctxT(t, 5*time.Second), k.LocalAddr().String(), tc, &quic.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = qc.CloseWithError(0, "") }()
		return qc.ConnectionState().TLS.PeerCertificates[0].SerialNumber.String()
	}
	before := presented()
	next, err := ca.NewIdentity("srv")
	if err != nil {
		t.Fatal(err)
	}
	if err := k.ReloadCertificate(next); err != nil {
		t.Fatal(err)
	}
	after := presented()
	if after == before || after != next.Cert.Leaf.SerialNumber.String() {
		t.Fatalf("serial before %s, after %s, want the new %s", before, after, next.Cert.Leaf.SerialNumber)
	}
	other, err := ca.NewIdentity("other")
	if err != nil {
		t.Fatal(err)
	}
	if err := k.ReloadCertificate(other); !errors.Is(err, transport.ErrCertificateRefused) {
		t.Fatalf("reload with another name: %v, want ErrCertificateRefused", err)
	}
	if got := presented(); got != after {
		t.Fatal("a refused certificate replaced the current one")
	}
}

// An emission whose receipts stop coming part way keeps the receipts that
// came, in order, and says why the rest did not: the context's end, or the
// connection's loss (with every receipt before it kept).
func TestRequestBatchKeepsTheReceiptsThatCame(t *testing.T) {
	for _, end := range []string{"context", "connection"} {
		t.Run(end, func(t *testing.T) {
			ca := newCA(t)
			r := newResolver()
			const answered = 5
			var mu sync.Mutex
			seen := 0
			b := startNode(t, testConfig(t, ca, "b"), r, handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
				mu.Lock()
				defer mu.Unlock()
				if seen++; seen <= answered {
					reply(&pb.Receipt{Code: pb.Receipt_PROCESSED, Watermark: uint64(seen)})
				}
			}))
			a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
			envs := make([]*pb.Envelope, 20)
			for i := range envs {
				envs[i] = envTo(t, "w@b", pb.Envelope_RECEIPT_PROCESSED)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type result struct {
				rcs []*pb.Receipt
				err error
			}
			done := make(chan result, 1)
			go func() {
				rcs, err := a.RequestBatch(ctx, "b", envs)
				done <- result{rcs, err}
			}()
			testutil.WaitFor(t, 10*time.Second, "every envelope reaches b and a has b's receipts", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return seen == len(envs) && transport.Waiting(a.Transport, "b") == len(envs)-answered
			})
			want := context.Canceled
			if end == "context" {
				cancel()
			} else {
				want = transport.ErrConnLost
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
			}
			var res result
			select {
			case res = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("RequestBatch did not return")
			}
			if !errors.Is(res.err, want) {
				t.Fatalf("err = %v, want %v", res.err, want)
			}
			for i, rc := range res.rcs {
				switch {
				case i < answered && (rc.GetMsgId() != envs[i].GetMsgId() || rc.GetWatermark() != uint64(i+1)):
					t.Fatalf("receipt %d = %v, want the receipt of %s with watermark %d", i, rc, envs[i].GetMsgId(), i+1)
				case i >= answered && rc != nil:
					t.Fatalf("receipt %d = %v for a message b never answered", i, rc)
				}
			}
		})
	}
}

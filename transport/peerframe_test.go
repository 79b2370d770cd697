package transport_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// withBody gives env a body of n bytes.
func withBody(tb testing.TB, env *pb.Envelope, n int) *pb.Envelope {
	tb.Helper()
	body, err := anypb.New(wrapperspb.Bytes(make([]byte, n)))
	if err != nil {
		tb.Fatal(err)
	}
	env.Body = body
	return env
}

// A peer whose MaxFrameSize is smaller than ours announces it: an
// envelope within our limit but over the peer's is refused here with
// ErrFrameTooLarge (in a batch: reported for it alone, even on the first
// connection), instead of being sent and making the peer close the
// connection, again and again, for everything else on it.
func TestEnvelopesAreHeldToThePeersFrameLimit(t *testing.T) {
	ca, r := newCA(t), newResolver()
	big := testConfig(t, ca, "big")
	big.MaxFrameSize, big.MaxReadBytes = 2<<20, 16<<20
	small := testConfig(t, ca, "small")
	small.MaxFrameSize = 256 << 10
	rec := &recorder{}
	a := startNode(t, big, r, &recorder{})
	startNode(t, small, r, rec)

	// A batch on the first connection: the middle envelope is too large
	// for the peer only.
	envs := []*pb.Envelope{
		envTo(t, "x@small", pb.Envelope_RECEIPT_PROCESSED),
		withBody(t, envTo(t, "x@small", pb.Envelope_RECEIPT_PROCESSED), 512<<10),
		envTo(t, "x@small", pb.Envelope_RECEIPT_PROCESSED),
	}
	rcs, err := a.RequestBatch(ctxT(t, 10*time.Second), "small", envs)
	var ee *transport.EncodeError
	if !errors.As(err, &ee) || len(ee.Errs) != 1 || !errors.Is(ee.Errs[1], transport.ErrFrameTooLarge) {
		t.Fatalf("RequestBatch err = %v, want an EncodeError for envelope 1 alone", err)
	}
	if !strings.Contains(ee.Errs[1].Error(), "announced") {
		t.Fatalf("the error does not say the limit is the recipient's: %v", ee.Errs[1])
	}
	if rcs[0].GetCode() != pb.Receipt_PROCESSED || rcs[1] != nil || rcs[2].GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("receipts %v, want PROCESSED, none, PROCESSED", rcs)
	}

	// A tell too large for the peer is refused at Send; the connection
	// stays and carries the next one.
	if err := a.Send(ctxT(t, 10*time.Second), "small", withBody(t, envTo(t, "x@small", pb.Envelope_RECEIPT_NONE), 512<<10)); !errors.Is(err, transport.ErrFrameTooLarge) {
		t.Fatalf("Send of a frame over the peer's limit = %v, want ErrFrameTooLarge", err)
	}
	if err := a.Send(ctxT(t, 10*time.Second), "small", envTo(t, "x@small", pb.Envelope_RECEIPT_NONE)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the small tell arrives", func() bool { return rec.count.Load() == 3 })
	if got := strings.Count(a.logs.String(), "msg=connected"); got != 1 {
		t.Fatalf("%d connections made, want 1 (the peer never closed one):\n%s", got, a.logs.String())
	}
	// Within both limits, a large envelope still goes.
	if err := a.Send(ctxT(t, 10*time.Second), "small", withBody(t, envTo(t, "x@small", pb.Envelope_RECEIPT_NONE), 200<<10)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the 200 KiB tell arrives", func() bool { return rec.count.Load() == 4 })
}

// A peer that announces no limit (a node of an older version) is taken to
// share ours; an announced limit below the smallest a config may set is
// raised to it; a larger one than ours changes nothing.
func TestAnnouncedFrameLimits(t *testing.T) {
	for _, tt := range []struct {
		name      string
		announced uint32
		fits      int // a body that must go through
		refused   int // a body that must be refused here (0: none)
	}{
		{"none announced", 0, 900 << 10, 0},
		{"tiny", 1, 700, 4 << 10},
		{"larger than ours", 1 << 30, 900 << 10, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ca, r := newCA(t), newResolver()
			a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
			cfg := testConfig(t, ca, "b")
			transport.SetHelloHook(&cfg, func(h *pb.Hello) { h.MaxFrameSize = tt.announced })
			rec := &recorder{}
			startNode(t, cfg, r, rec)
			if err := a.Send(ctxT(t, 10*time.Second), "b", withBody(t, envTo(t, "x@b", pb.Envelope_RECEIPT_NONE), tt.fits)); err != nil {
				t.Fatalf("a body of %d bytes: %v", tt.fits, err)
			}
			testutil.WaitFor(t, 10*time.Second, "delivered", func() bool { return rec.count.Load() == 1 })
			if tt.refused > 0 {
				err := a.Send(ctxT(t, 10*time.Second), "b", withBody(t, envTo(t, "x@b", pb.Envelope_RECEIPT_NONE), tt.refused))
				if !errors.Is(err, transport.ErrFrameTooLarge) {
					t.Fatalf("a body of %d bytes = %v, want ErrFrameTooLarge", tt.refused, err)
				}
			}
		})
	}
}

// A peer that restarts with a larger MaxFrameSize is held to its new
// limit, not to the one its last connection announced: a message between
// the two is delivered, never refused for the old limit.
func TestPeerRestartedWithLargerFramesGetsThem(t *testing.T) {
	ca, r := newCA(t), newResolver()
	big := testConfig(t, ca, "big")
	big.MaxFrameSize, big.MaxReadBytes = 2<<20, 16<<20
	a := startNode(t, big, r, &recorder{})
	small := testConfig(t, ca, "peer")
	small.MaxFrameSize = 256 << 10
	old := startNode(t, small, r, &recorder{})
	if _, err := a.Request(ctxT(t, 10*time.Second), "peer", envTo(t, "x@peer", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	larger := testConfig(t, ca, "peer")
	larger.MaxFrameSize, larger.MaxReadBytes, larger.BootID = 2<<20, 16<<20, "restarted"
	rec := &recorder{}
	startNode(t, larger, r, rec)
	testutil.WaitFor(t, 10*time.Second, "the message between the two limits delivered", func() bool {
		rc, err := a.Request(ctxT(t, 10*time.Second), "peer", withBody(t, envTo(t, "x@peer", pb.Envelope_RECEIPT_PROCESSED), 512<<10))
		if errors.Is(err, transport.ErrFrameTooLarge) {
			t.Fatalf("refused for the limit of the peer before its restart: %v", err)
		}
		return err == nil && rc.GetCode() == pb.Receipt_PROCESSED
	})
}

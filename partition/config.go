package partition

import (
	"log/slog"
	"time"

	"github.com/meshnode/meshnode/internal/badconfig"
)

// Config configures a Relay. Start from DefaultConfig.
type Config struct {
	Partitions int // relay loops; recipients are spread by FNV-1a
	BatchSize  int // max messages per emission (one Deliver call)
	// BatchBytes bounds the stored bytes of one emission's messages (its
	// first message always goes, whatever its size), so a queue of large
	// messages is not read into memory a thousand at a time.
	BatchBytes  int
	DownRecheck time.Duration // a down peer's queues are looked at again after this even without NodeAlive
	MaxDue      int           // recipients taken from the store per loop iteration
	// MaxAckPending bounds, per stream, the fully positive emissions whose
	// Ack is still committing while the next one is sent (pipelining).
	// Emissions awaiting their receipts are at most two, the second
	// chained to the first (see Deliverer).
	MaxAckPending int
	// DeliverTimeout bounds one emission's wait for its receipts. A receipt
	// lost while the connection stays up would otherwise hold the stream,
	// and its peer's AIMD slots, until the relay closes.
	DeliverTimeout time.Duration
	// DirectTimeout bounds the direct attempt of Send; past it the message
	// is stored and the caller told Queued (a slow handler does not hold
	// the caller).
	DirectTimeout time.Duration
	Backoff       BackoffConfig // delay after a handler failure or a deferral
	Limiter       LimiterConfig // AIMD limits of every per-node Limiter
	Forward       ForwardConfig // when a peer alive but unreachable is sent to through another member
	Logger        *slog.Logger  // logs under component=relay; nil discards them
}

// DefaultConfig returns a Config with every field set.
func DefaultConfig() Config {
	return Config{
		Partitions:     4,                      // a loop per core and then some; recipients never wait for each other anyway
		BatchSize:      1024,                   // amortises a round trip over many messages; the drain's best in measurement, and a default mailbox holds it
		BatchBytes:     4 << 20,                // a 4 MiB frame's worth; 128-byte messages never reach it
		DownRecheck:    10 * time.Second,       // safety net if a NodeAlive event is missed
		MaxDue:         256,                    // bounds one iteration's work
		MaxAckPending:  4,                      // acks of up to 4 emissions commit while the next is out
		DeliverTimeout: 30 * time.Second,       // far above a batch's round trip plus the receiver's fsync
		DirectTimeout:  2 * time.Second,        // a caller waits at most this before Queued
		Backoff:        DefaultBackoffConfig(), // 100 ms base, 30 s cap, full jitter
		Limiter:        DefaultLimiterConfig(), // 10 initial, 1 min, 4096 max
		Forward:        DefaultForwardConfig(), // after 2 failed emissions; probe every 5 s
		Logger:         slog.Default(),         // structured logs
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	bad := func(s string) error { return badconfig.New(ErrBadConfig, "%s", s) }
	switch {
	case c.Partitions < 1 || c.Partitions > 1024:
		return bad("Partitions must be in [1, 1024]")
	case c.BatchSize < 1:
		return bad("BatchSize must be >= 1")
	case c.BatchBytes < 1:
		return bad("BatchBytes must be >= 1")
	case c.DownRecheck <= 0:
		return bad("DownRecheck must be > 0")
	case c.MaxDue < 1:
		return bad("MaxDue must be >= 1")
	case c.MaxAckPending < 1:
		return bad("MaxAckPending must be >= 1")
	case c.DeliverTimeout <= 0:
		return bad("DeliverTimeout must be > 0")
	case c.DirectTimeout <= 0:
		return bad("DirectTimeout must be > 0")
	case c.Backoff.Base <= 0 || c.Backoff.Cap < c.Backoff.Base:
		return bad("Backoff needs 0 < Base <= Cap")
	case c.Limiter.Min < 1 || c.Limiter.Max < c.Limiter.Min ||
		c.Limiter.Initial < c.Limiter.Min || c.Limiter.Initial > c.Limiter.Max:
		return bad("Limiter needs 1 <= Min <= Initial <= Max")
	case c.Forward.After < 0 || (c.Forward.After > 0 && c.Forward.Probe <= 0):
		return bad("Forward needs After >= 0, and Probe > 0 when After > 0")
	}
	return nil
}

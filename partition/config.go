package partition

import (
	"fmt"
	"log/slog"
	"time"
)

// Config configures a Relay. Start from DefaultConfig.
type Config struct {
	Partitions  int           // relay loops; recipients are spread by FNV-1a
	BatchSize   int           // max messages per Deliver call
	DownRecheck time.Duration // a down peer's queues are looked at again after this even without NodeAlive
	MaxDue      int           // recipients taken from the store per loop iteration
	// MaxAckPending bounds, per recipient, the fully positive batches whose
	// Ack is still committing while the next batch is sent (pipelining).
	// 1 = at most one batch waits for its ack fsync while the next is on
	// the wire; the unreceipted batch in flight is always at most one.
	MaxAckPending int
	// DeliverTimeout bounds one batch's wait for its receipts. A receipt
	// lost while the connection stays up would otherwise hold the batch,
	// and its peer's AIMD slots, until the relay closes.
	DeliverTimeout time.Duration
	Logger         *slog.Logger
}

// DefaultConfig returns a Config with every field set.
func DefaultConfig() Config {
	return Config{
		Partitions:     4,                // DESIGN default P
		BatchSize:      128,              // amortises a round trip over many messages
		DownRecheck:    10 * time.Second, // safety net if a NodeAlive event is missed
		MaxDue:         256,              // bounds one iteration's work
		MaxAckPending:  4,                // acks of up to 4 batches commit while the next batch is out
		DeliverTimeout: 30 * time.Second, // far above a batch's round trip plus the receiver's fsync
		Logger:         slog.Default(),   // structured logs
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > 1024:
		return fmt.Errorf("%w: Partitions must be in [1, 1024]", ErrInvalidConfig)
	case c.BatchSize < 1:
		return fmt.Errorf("%w: BatchSize must be >= 1", ErrInvalidConfig)
	case c.DownRecheck <= 0:
		return fmt.Errorf("%w: DownRecheck must be > 0", ErrInvalidConfig)
	case c.MaxDue < 1:
		return fmt.Errorf("%w: MaxDue must be >= 1", ErrInvalidConfig)
	case c.MaxAckPending < 1:
		return fmt.Errorf("%w: MaxAckPending must be >= 1", ErrInvalidConfig)
	case c.DeliverTimeout <= 0:
		return fmt.Errorf("%w: DeliverTimeout must be > 0", ErrInvalidConfig)
	case c.Logger == nil:
		return fmt.Errorf("%w: Logger is nil", ErrInvalidConfig)
	}
	return nil
}

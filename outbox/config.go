package outbox

import (
	"fmt"
	"log/slog"
	"time"
)

// Config configures a Store. Start from DefaultConfig.
type Config struct {
	Path         string        // the bbolt file (node passes DataDir/outbox.db)
	LockTimeout  time.Duration // how long Open waits for the file lock before ErrLocked
	MaxAttempts  int           // counted attempts before the dead-letter queue
	Backoff      BackoffConfig // retry delay after a counted failure
	Limiter      LimiterConfig // AIMD limits of every per-node Limiter
	DedupeWindow time.Duration // receiver-side idempotency window
	MaxBatch     int           // max operations per group-commit transaction
	QueueSize    int           // bound of the committer's input queue
	CommitLinger time.Duration // max wait for the callers of the last commit to come back before the next one (0 = none)
	Now          func() time.Time
	Logger       *slog.Logger
}

// DefaultConfig returns a Config for the bbolt file at path with every field
// set.
func DefaultConfig(path string) Config {
	return Config{
		Path:         path,                   // the data file
		LockTimeout:  time.Second,            // fail fast when another node holds the file
		MaxAttempts:  10,                     // DESIGN default
		Backoff:      DefaultBackoffConfig(), // 100ms base, 30s cap, full jitter
		Limiter:      DefaultLimiterConfig(), // 10 initial, 1 min, 100 max
		DedupeWindow: 10 * time.Minute,       // keys older than this are forgotten
		MaxBatch:     8192,                   // bounds one transaction's size and latency
		QueueSize:    16384,                  // callers block (ctx-aware) beyond this
		CommitLinger: 200 * time.Microsecond, // small against an fsync (~1.5 ms); lets one commit carry every concurrent caller
		Now:          time.Now,               // the clock; tests may replace it
		Logger:       slog.Default(),         // structured logs
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Path == "":
		return fmt.Errorf("%w: Path is empty", ErrInvalidConfig)
	case c.LockTimeout <= 0:
		return fmt.Errorf("%w: LockTimeout must be > 0 (0 would wait forever for the lock)", ErrInvalidConfig)
	case c.MaxAttempts < 1:
		return fmt.Errorf("%w: MaxAttempts must be >= 1", ErrInvalidConfig)
	case c.Backoff.Base <= 0 || c.Backoff.Cap < c.Backoff.Base:
		return fmt.Errorf("%w: Backoff needs 0 < Base <= Cap", ErrInvalidConfig)
	case c.Limiter.Min < 1 || c.Limiter.Max < c.Limiter.Min ||
		c.Limiter.Initial < c.Limiter.Min || c.Limiter.Initial > c.Limiter.Max:
		return fmt.Errorf("%w: Limiter needs 1 <= Min <= Initial <= Max", ErrInvalidConfig)
	case c.DedupeWindow <= 0:
		return fmt.Errorf("%w: DedupeWindow must be > 0", ErrInvalidConfig)
	case c.MaxBatch < 1:
		return fmt.Errorf("%w: MaxBatch must be >= 1", ErrInvalidConfig)
	case c.QueueSize < 1:
		return fmt.Errorf("%w: QueueSize must be >= 1", ErrInvalidConfig)
	case c.CommitLinger < 0 || c.CommitLinger > time.Second:
		return fmt.Errorf("%w: CommitLinger must be in [0, 1s]", ErrInvalidConfig)
	case c.Now == nil:
		return fmt.Errorf("%w: Now is nil", ErrInvalidConfig)
	case c.Logger == nil:
		return fmt.Errorf("%w: Logger is nil", ErrInvalidConfig)
	}
	return nil
}

package outbox

import (
	"log/slog"
	"time"

	"github.com/meshnode/meshnode/internal/badconfig"
)

// Config configures a Store. Start from DefaultConfig.
type Config struct {
	Path        string        // the bbolt file (node passes DataDir/outbox.db)
	LockTimeout time.Duration // how long Open waits for the file lock before ErrLocked
	MaxAttempts int           // handler failures a message may have before the dead-letter queue

	// KeyWindow is how long a receiver remembers an application idempotency
	// key (on disk; memory does not grow with it).
	KeyWindow time.Duration
	// StreamRetention is how long a receiver keeps a stream's watermark
	// after it last changed. A sender gives up a message stored longer
	// than StreamRetention - RetentionMargin, so no stream is forgotten
	// while its sender may still send it a message that already ran.
	StreamRetention time.Duration
	RetentionMargin time.Duration
	// MaxClockSkew: once a message has been on the wire, the sender gives
	// it up for age only after its TTL plus this, since the receiver
	// measures the TTL on its own clock from the arrival of a copy.
	MaxClockSkew time.Duration
	// MaxDowntime bounds the wall-clock difference counted as elapsed time
	// across a reboot of the machine. The wall clock may step (a device
	// without a real-time clock, a manual change); a step of years then
	// neither expires every message nor stops ages from counting. A
	// restart within one boot counts the time the store was closed on the
	// boot's clock (Booted), exactly and without this bound.
	MaxDowntime time.Duration
	// CheckpointInterval: the elapsed clock is persisted with every commit
	// and at least this often while the store is idle, so a crash loses
	// at most this much of it (plus what MaxDowntime cuts).
	CheckpointInterval time.Duration

	MaxBatch      int           // max records per group-commit transaction
	MaxBatchBytes int           // max message bytes per group-commit transaction
	QueueSize     int           // bound of the committer's input queue
	CommitLinger  time.Duration // max wait for the callers of the last commit to come back before the next one (0 = none)
	SequenceBlock uint64        // sequences reserved per durable write of the high-water (at most 65,536 while the wall clock is set: each block starts at the clock)

	Clock  Clock        // wall and monotonic time; tests replace it
	Logger *slog.Logger // logs under component=outbox; nil discards them

	// OnForget, if set, is called from the committer after a commit that
	// forgot receiver streams (idle past StreamRetention), so that what
	// keeps its own record of a stream (a daemon inbox) can forget it too,
	// as far as the forgotten watermark went. It must not block.
	OnForget func(streams []ForgottenStream)
}

// ForgottenStream is a receiver stream a commit forgot: its StreamKey and
// the watermark it had. A record of the stream above that watermark (a
// handler's, ahead of it after a crash, or made since) is not covered by
// the forgotten horizon and must be kept.
type ForgottenStream struct {
	Stream    []byte
	Watermark uint64
}

// maxSequenceBlock bounds Config.SequenceBlock: a reservation skips at most
// this many sequences at every start, far below what would wrap them.
const maxSequenceBlock = 1 << 32

// DefaultConfig returns a Config for the bbolt file at path with every field
// set.
func DefaultConfig(path string) Config {
	return Config{
		Path:               path,                   // the data file
		LockTimeout:        time.Second,            // fail fast when another node holds the file
		MaxAttempts:        10,                     // a handler gets ten tries before its message is poison
		KeyWindow:          24 * time.Hour,         // an application retrying after a day is a new request
		StreamRetention:    30 * 24 * time.Hour,    // a stream idle for a month is forgotten
		RetentionMargin:    7 * 24 * time.Hour,     // senders give up at 23 days, a week before receivers forget
		MaxClockSkew:       time.Minute,            // slack for two clocks measuring one TTL
		MaxDowntime:        24 * time.Hour,         // a restart counts at most a day of wall-clock difference
		CheckpointInterval: time.Minute,            // one small write a minute while idle
		MaxBatch:           8192,                   // bounds one transaction's size and latency
		MaxBatchBytes:      16 << 20,               // and its memory: a fan-out of big bodies is split
		QueueSize:          16384,                  // callers block (ctx-aware) beyond this
		CommitLinger:       200 * time.Microsecond, // small against an fsync (~1.5 ms); lets one commit carry every concurrent caller
		SequenceBlock:      1 << 16,                // one fsync per 65,536 sequences
		Clock:              SystemClock(),          // the system's clocks
		Logger:             slog.Default(),         // structured logs
	}
}

// MaxAge is the longest a sender keeps a message: StreamRetention minus
// RetentionMargin. A TTL longer than that is refused.
func (c Config) MaxAge() time.Duration { return c.StreamRetention - c.RetentionMargin }

// Validate reports the first invalid field.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error { return badconfig.New(ErrBadConfig, format, args...) }
	switch {
	case c.Path == "":
		return bad("Path is empty")
	case c.LockTimeout <= 0:
		return bad("LockTimeout must be > 0 (0 would wait forever for the lock)")
	case c.MaxAttempts < 1:
		return bad("MaxAttempts must be >= 1")
	case c.KeyWindow <= 0:
		return bad("KeyWindow must be > 0")
	case c.StreamRetention <= 0 || c.RetentionMargin <= 0 || c.RetentionMargin >= c.StreamRetention:
		return bad("need 0 < RetentionMargin < StreamRetention")
	case c.MaxClockSkew < 0:
		return bad("MaxClockSkew must be >= 0")
	case c.MaxDowntime < 0:
		return bad("MaxDowntime must be >= 0")
	case c.CheckpointInterval <= 0:
		return bad("CheckpointInterval must be > 0")
	case c.MaxBatch < 1:
		return bad("MaxBatch must be >= 1")
	case c.MaxBatchBytes < 1:
		return bad("MaxBatchBytes must be >= 1")
	case c.QueueSize < 1:
		return bad("QueueSize must be >= 1")
	case c.CommitLinger < 0 || c.CommitLinger > time.Second:
		return bad("CommitLinger must be in [0, 1s]")
	case c.SequenceBlock < 1 || c.SequenceBlock > maxSequenceBlock:
		return bad("SequenceBlock must be between 1 and %d", uint64(maxSequenceBlock))
	case c.Clock == nil:
		return bad("Clock is nil")
	}
	return nil
}

package inbox

import (
	"fmt"
	"time"
)

// Config configures a Store.
type Config struct {
	Path        string        // the bbolt file (the daemon uses DataDir/inbox.db)
	LockTimeout time.Duration // how long Open waits for another process's lock before ErrLocked (1 s)
	MaxMessages int           // unacknowledged messages per inbox before Append returns ErrFull (100000)
	MaxPull     int           // most messages one Pull returns, whatever max asks (1000)
	// MaxPullBytes bounds the stored bytes of the messages one Pull
	// returns (4 MiB): it stops before the message that would exceed it,
	// but always returns at least one, so a pull makes progress.
	MaxPullBytes int
	MaxWait      time.Duration // longest long-poll a Pull may ask for (60 s)
}

// DefaultConfig returns a Config for the file at path with every field set.
func DefaultConfig(path string) Config {
	return Config{
		Path:         path,
		LockTimeout:  time.Second,
		MaxMessages:  100_000,
		MaxPull:      1000,
		MaxPullBytes: 4 << 20,
		MaxWait:      time.Minute,
	}
}

// Validate reports the first problem with c, wrapped in ErrBadConfig.
func (c Config) Validate() error {
	switch {
	case c.Path == "":
		return fmt.Errorf("%w: path is empty", ErrBadConfig)
	case c.LockTimeout <= 0:
		return fmt.Errorf("%w: lock timeout must be positive", ErrBadConfig)
	case c.MaxMessages <= 0:
		return fmt.Errorf("%w: max messages %d must be positive", ErrBadConfig, c.MaxMessages)
	case c.MaxPull <= 0:
		return fmt.Errorf("%w: max pull %d must be positive", ErrBadConfig, c.MaxPull)
	case c.MaxPullBytes <= 0:
		return fmt.Errorf("%w: max pull bytes %d must be positive", ErrBadConfig, c.MaxPullBytes)
	case c.MaxWait < 0:
		return fmt.Errorf("%w: max wait must not be negative", ErrBadConfig)
	}
	return nil
}

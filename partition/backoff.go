package partition

import (
	"math/rand/v2"
	"time"
)

// BackoffConfig is the retry delay policy: full jitter,
// random(0, min(Cap, Base × 2^attempt)).
type BackoffConfig struct {
	Base time.Duration // first ceiling; default 100ms
	Cap  time.Duration // largest ceiling; default 30s
}

// DefaultBackoffConfig returns the defaults: the first retry within 100 ms,
// never more than 30 s between tries.
func DefaultBackoffConfig() BackoffConfig {
	return BackoffConfig{
		Base: 100 * time.Millisecond, // a quick first retry
		Cap:  30 * time.Second,       // a peer back from an outage is tried within 30 s
	}
}

// ceiling returns min(Cap, Base × 2^attempt) without overflowing for any
// attempt (negative attempts count as 0).
func (b BackoffConfig) ceiling(attempt int) time.Duration {
	if b.Base <= 0 || b.Cap <= 0 {
		return 0
	}
	if attempt < 0 {
		attempt = 0
	}
	d := b.Base
	for i := 0; i < attempt; i++ {
		if d >= b.Cap || d > (1<<62)/2 {
			return b.Cap
		}
		d *= 2
	}
	return min(d, b.Cap)
}

// Delay returns a full-jitter delay for the given attempt number:
// uniformly random in [0, min(Cap, Base × 2^attempt)). It is safe for any
// attempt, including huge ones, and returns 0 for a zero config.
func (b BackoffConfig) Delay(attempt int) time.Duration {
	c := b.ceiling(attempt)
	if c <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(c)))
}

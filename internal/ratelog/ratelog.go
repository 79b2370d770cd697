// Package ratelog limits how often a log line about one key is written, so
// that a peer repeating the same bad input cannot flood the log: the first
// event of a key in each interval is logged with the number of events
// suppressed since the last line. It is not public API.
package ratelog

import (
	"sync"
	"time"
)

// maxKeys bounds the keys remembered; past it the oldest interval's keys
// are forgotten at once (a line may then repeat early, never go missing).
const maxKeys = 4096

// Limiter says when to log an event about a key. The zero value is not
// usable; use New. Safe for concurrent use.
type Limiter struct {
	every time.Duration

	// mu guards the field below.
	mu   sync.Mutex
	keys map[string]*entry
}

type entry struct {
	last       time.Time // when a line was last written
	suppressed int       // events since then
}

// New returns a Limiter that lets one line per key through every interval.
func New(every time.Duration) *Limiter {
	return &Limiter{every: every, keys: make(map[string]*entry)}
}

// Allow reports whether an event about key should be logged now, and how
// many events of key were suppressed since the last line that was.
func (l *Limiter) Allow(key string) (ok bool, suppressed int) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.keys[key]
	if e != nil && now.Sub(e.last) < l.every {
		e.suppressed++
		return false, 0
	}
	if e == nil {
		if len(l.keys) >= maxKeys {
			for k, old := range l.keys {
				if now.Sub(old.last) >= l.every {
					delete(l.keys, k)
				}
			}
			if len(l.keys) >= maxKeys {
				clear(l.keys)
			}
		}
		e = &entry{}
		l.keys[key] = e
	}
	suppressed = e.suppressed
	e.last, e.suppressed = now, 0
	return true, suppressed
}

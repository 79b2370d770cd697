//go:build unix

package storecheck

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// lockShared takes a shared flock on f (bbolt takes an exclusive one while
// a process has the store open), waiting up to timeout.
func lockShared(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			return ErrBusy
		}
		time.Sleep(50 * time.Millisecond) // bbolt's own lock polling interval
	}
}

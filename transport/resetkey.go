package transport

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/quic-go/quic-go"
)

// resetKeyFile is the name of the stateless-reset key in Config.DataDir.
const resetKeyFile = "quic-reset.key"

// loadResetKey returns the stateless-reset key persisted in dir, creating it
// (32 random bytes, mode 0600) on first use. A restarted node with the same
// key answers packets of its old connections with a stateless reset, so
// peers drop them at once instead of waiting for the idle timeout.
func loadResetKey(dir string) (*quic.StatelessResetKey, error) {
	var key quic.StatelessResetKey
	if dir == "" {
		if _, err := rand.Read(key[:]); err != nil {
			return nil, fmt.Errorf("transport: reset key: %w", err)
		}
		return &key, nil
	}
	path := filepath.Join(dir, resetKeyFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(b) != len(key) {
			return nil, fmt.Errorf("transport: reset key %s: %d bytes, want %d (delete the file to regenerate it)", path, len(b), len(key))
		}
		copy(key[:], b)
		return &key, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("transport: reset key: %w", err)
	}
	if _, err := rand.Read(key[:]); err != nil {
		return nil, fmt.Errorf("transport: reset key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("transport: reset key: %w", err)
	}
	// Write to a temporary file and rename, so a crash never leaves a short key.
	tmp, err := os.CreateTemp(dir, resetKeyFile+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("transport: reset key: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("transport: reset key: %w", err)
	}
	if _, err := tmp.Write(key[:]); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("transport: reset key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("transport: reset key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("transport: reset key: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, fmt.Errorf("transport: reset key: %w", err)
	}
	return &key, nil
}

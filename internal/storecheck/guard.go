package storecheck

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Marker files next to a store file.
const (
	cleanSuffix = ".clean" // written after a clean close; removed at open
	idSuffix    = ".id"    // the store's identity, hex, written once
	highSuffix  = ".seq"   // the highest sequence reserved, decimal (RecordHigh)
)

// CleanPath and IDPath name the marker files of the store at path.
func CleanPath(path string) string { return path + cleanSuffix }

// IDPath names the file that records the identity of the store at path.
func IDPath(path string) string { return path + idSuffix }

// maxHigh bounds a sequence record: 2^62 sequences take a store over a
// million years at a million a second.
const maxHigh = 1 << 62

// HighPath names the file that records the sequence high-water of the
// store at path.
func HighPath(path string) string { return path + highSuffix }

// RecordHigh records high as the highest sequence the store at path has
// reserved, beside the file: a store file restored from a backup goes back
// with its own record, not with this one (ReadHigh).
func RecordHigh(path string, high uint64) error {
	return writeSynced(HighPath(path), []byte(strconv.FormatUint(high, 10)+"\n"))
}

// ReadHigh returns what RecordHigh last recorded for the store at path, 0
// if nothing was.
func ReadHigh(path string) (uint64, error) {
	b, err := os.ReadFile(HighPath(path))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("storecheck: %w", err)
	}
	high, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err == nil && high >= maxHigh {
		err = strconv.ErrRange // no store gets there: a damaged record, which would make sequences wrap
	}
	if err != nil {
		return 0, fmt.Errorf("storecheck: %s does not hold a sequence (%q: %w): put back its own copy, or remove it (sequences then continue from the store file's own record, which a restored file may have from before sequences it handed out)", HighPath(path), bytes.TrimSpace(b), err)
	}
	return high, nil
}

// Opened says what Before found.
type Opened struct {
	New    bool   // no file yet, and none before: a new store
	Clean  bool   // the last run closed the store cleanly
	Report Report // the check's findings (zero for a new store)
}

// Before checks the store file at path before bbolt opens it and removes
// the clean-shutdown marker, so that a crash from here on leaves none:
//
//   - a missing or empty file is a new store, unless the identity file
//     says this data directory had one (ErrLost);
//   - the structure and the key order are always checked (bbolt, opening a
//     file without a stored free list as the outbox does, panics on keys
//     out of order while it rebuilds the list); a damaged file is refused
//     (ErrDamaged).
//
// It waits up to lockTimeout for another process that has the file open;
// then it gives up with ErrBusy (bbolt's own open reports the lock).
func Before(path string, lockTimeout time.Duration) (Opened, error) {
	var o Opened
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist), err == nil && st.Size() == 0:
		id, ierr := os.ReadFile(IDPath(path))
		if ierr == nil {
			what := "is missing"
			if err == nil {
				what = "is empty"
			}
			return o, fmt.Errorf("%w: %s %s, but this data directory had store %s (recorded in %s)",
				ErrLost, path, what, strings.TrimSpace(string(id)), IDPath(path))
		}
		if !errors.Is(ierr, fs.ErrNotExist) {
			return o, fmt.Errorf("storecheck: %w", ierr)
		}
		o.New = true
		return o, nil
	case err != nil:
		return o, fmt.Errorf("storecheck: %w", err)
	}
	_, cerr := os.Stat(CleanPath(path))
	o.Clean = cerr == nil
	o.Report, err = checkLocked(path, lockTimeout)
	if err != nil {
		return o, err
	}
	if o.Clean {
		if err := os.Remove(CleanPath(path)); err != nil {
			return o, fmt.Errorf("storecheck: remove clean marker: %w", err)
		}
		if err := syncDir(filepath.Dir(path)); err != nil {
			return o, err
		}
	}
	return o, nil
}

// Identify compares the identity of the store at path (made with its file
// and kept in it) with the one recorded beside it, and records it when
// there is none yet. A different one means another store's file was put in
// its place: ErrReplaced.
func Identify(path string, id []byte) error {
	want := []byte(hex.EncodeToString(id))
	got, err := os.ReadFile(IDPath(path))
	switch {
	case err == nil:
		if !bytes.Equal(bytes.TrimSpace(got), want) {
			return fmt.Errorf("%w: %s is store %s, but this data directory had store %s (recorded in %s)",
				ErrReplaced, path, want, bytes.TrimSpace(got), IDPath(path))
		}
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("storecheck: %w", err)
	}
	return writeSynced(IDPath(path), append(want, '\n'))
}

// MarkClean records that the store at path was closed cleanly.
func MarkClean(path string) error {
	return writeSynced(CleanPath(path), nil)
}

// Forget removes the identity and clean markers of the store at path: the
// operator's decision that a lost store is gone and a new one may start.
func Forget(path string) error {
	for _, p := range []string{IDPath(path), CleanPath(path)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("storecheck: %w", err)
		}
	}
	return syncDir(filepath.Dir(path))
}

// writeSynced writes data to path atomically (a temporary file, fsync,
// rename, fsync of the directory).
func writeSynced(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("storecheck: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("storecheck: write %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("storecheck: %w", err)
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("storecheck: sync %s: %w", dir, err)
	}
	return nil
}

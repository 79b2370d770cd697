package storecheck_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/storecheck"
)

// Files that bbolt panics on, which Check once passed.

// healthyFile writes a makeFile file of the given kind and returns its
// bytes, its path and its page size.
func healthyFile(t *testing.T, kind string) ([]byte, string, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	makeFile(t, path, fileOptions[kind])
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b, path, int(binary.NativeEndian.Uint32(b[16+8:]))
}

// A leaf element with an empty key, every field in bounds and in order:
// bbolt never writes one, and asserts on one it reads for a write ("read:
// zero-length inode key", a panic in the first Put of any bucket, the
// outbox's first commit at Open).
func TestEmptyKeyIsDamage(t *testing.T) {
	ne := binary.NativeEndian
	b, path, ps := healthyFile(t, "freelist-synced")
	m0, m1 := b[16:], b[ps+16:]
	root := int(ne.Uint64(m0[16:]))
	if ne.Uint64(m1[48:]) > ne.Uint64(m0[48:]) {
		root = int(ne.Uint64(m1[16:]))
	}
	p := b[root*ps:]
	if ne.Uint16(p[8:]) != 0x02 {
		t.Fatalf("root page %d is not a leaf", root)
	}
	e := p[16:] // element 0: pos at 4, ksize at 8
	ne.PutUint32(e[4:], ne.Uint32(e[4:])+ne.Uint32(e[8:]))
	ne.PutUint32(e[8:], 0)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := storecheck.Check(path); !errors.Is(err, storecheck.ErrDamaged) {
		t.Fatalf("Check of a root leaf with an empty key: %v, want ErrDamaged", err)
	}
}

// bbolt opening a file without a stored free list (NoFreelistSync, as the
// outbox does) rebuilds the list and panics on keys out of order: one byte
// of a key changed after a clean close crashed Open, since Before checked
// the key order only after a run that did not end cleanly.
func TestCleanStoreWithKeysOutOfOrderIsRefused(t *testing.T) {
	ne := binary.NativeEndian
	b, path, ps := healthyFile(t, "no-freelist-sync")
	found := false
	for p := 2; (p+1)*ps <= len(b) && !found; p++ {
		h := b[p*ps:]
		if ne.Uint64(h) != uint64(p) || ne.Uint16(h[8:]) != 0x02 || ne.Uint16(h[10:]) < 10 {
			continue
		}
		c := bytes.Clone(b)
		c[p*ps+16+int(ne.Uint32(c[p*ps+16+4:]))] = 0xFF // the first key now sorts after the others
		if err := os.WriteFile(path, c, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := storecheck.Check(path)
		found = err != nil // a page in use
	}
	if !found {
		t.Fatal("no leaf page in use")
	}
	if err := storecheck.MarkClean(path); err != nil {
		t.Fatal(err)
	}
	if _, err := storecheck.Before(path, time.Second); !errors.Is(err, storecheck.ErrDamaged) {
		t.Fatalf("Before on a cleanly closed store with keys out of order: %v, want ErrDamaged", err)
	}
}

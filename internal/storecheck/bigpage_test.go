package storecheck_test

import (
	"encoding/binary"
	"errors"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/storecheck"
)

// Check bounds a page by the file's size, in uint64, and then
// allocates it: make([]byte, (overflow+1)*pageSize). A file of more than
// 2 GiB (a data directory from a 64-bit board with a backlog, here a
// sparse one) whose root page says 524288 overflow pages passes the bound
// (2 GiB + 4 KiB < 3 GiB) and the make gets a length past a 32-bit int:
// "makeslice: len out of range", a panic in outbox.Open (which runs
// Before on every open, before bbolt) and in meshnode doctor, where the
// package promises it never panics and reports ErrDamaged. Such a page
// is now a problem of the file. Skipped on 64 bits, where the same file
// makes Check allocate 2 GiB (the length fits an int there).
func TestPagePastAnIntIsAProblem(t *testing.T) {
	if strconv.IntSize == 64 {
		t.Skip("the hazard is a 32-bit int; on 64 bits this file costs a 2 GiB allocation")
	}
	const ps = 4096
	const size = 3 << 30
	path := filepath.Join(t.TempDir(), "outbox.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil { // sparse: no blocks written
		t.Fatal(err)
	}
	ne := binary.NativeEndian
	for id := uint64(0); id < 2; id++ {
		var p [16 + 64]byte
		ne.PutUint64(p[0:], id)
		ne.PutUint16(p[8:], 0x04) // meta
		m := p[16:]
		ne.PutUint32(m[0:], 0xED0CDAED)
		ne.PutUint32(m[4:], 2)
		ne.PutUint32(m[8:], ps)
		ne.PutUint64(m[16:], 2)          // root
		ne.PutUint64(m[32:], ^uint64(0)) // no stored free list
		ne.PutUint64(m[40:], size/ps)    // high-water: the whole file
		ne.PutUint64(m[48:], 1+id)       // txid
		h := fnv.New64a()
		h.Write(m[:56])
		ne.PutUint64(m[56:], h.Sum64())
		if _, err := f.WriteAt(p[:], int64(id*ps)); err != nil {
			t.Fatal(err)
		}
	}
	var root [16]byte
	ne.PutUint64(root[0:], 2)
	ne.PutUint16(root[8:], 0x02)      // leaf
	ne.PutUint32(root[12:], 1<<31/ps) // overflow pages: 2 GiB + one page in all
	if _, err := f.WriteAt(root[:], 2*ps); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("storecheck.Before (outbox.Open's check) panicked on a damaged 3 GiB file: %v", r)
		}
	}()
	if _, err := storecheck.Before(path, time.Second); !errors.Is(err, storecheck.ErrDamaged) {
		t.Fatalf("storecheck.Before on a page larger than an int: %v, want ErrDamaged", err)
	}
}

package storecheck_test

import (
	"encoding/binary"
	"errors"
	"hash/fnv"
	"os"
	"path/filepath"
	"runtime"
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
// is now a problem of the file. Skipped on 64 bits, where the length fits
// an int (TestDamagedOverflowCountCostsNoMemory checks the same file there).
func TestPagePastAnIntIsAProblem(t *testing.T) {
	if strconv.IntSize == 64 {
		t.Skip("the hazard is a 32-bit int")
	}
	path := sparseStoreWithHugePage(t)
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("storecheck.Before (outbox.Open's check) panicked on a damaged 3 GiB file: %v", r)
		}
	}()
	if _, err := storecheck.Before(path, time.Second); !errors.Is(err, storecheck.ErrDamaged) {
		t.Fatalf("storecheck.Before on a page larger than an int: %v, want ErrDamaged", err)
	}
}

// sparseStoreWithHugePage writes a sparse 3 GiB bbolt file whose root, an
// empty leaf, says it has 524288 overflow pages (2 GiB and a page in all).
func sparseStoreWithHugePage(t *testing.T) string {
	t.Helper()
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
	return path
}

// A page's overflow count is one field; damaged, it once made Check
// allocate and read everything it claims, up to the whole file: 2 GiB
// here, for an empty leaf of 16 bytes. A small 64-bit board checking its
// store at start (every Open checks the structure) would be
// killed for memory instead of starting or being told the file is
// damaged. Check now reads what a page's elements use.
func TestDamagedOverflowCountCostsNoMemory(t *testing.T) {
	path := sparseStoreWithHugePage(t)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := storecheck.Check(path)
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("Check allocated %d MiB for a file whose only page holds 16 bytes (err %v)", grew>>20, err)
	}
	if strconv.IntSize == 32 && !errors.Is(err, storecheck.ErrDamaged) {
		t.Fatalf("Check on 32 bits: %v, want ErrDamaged (a page past an int)", err)
	}
}

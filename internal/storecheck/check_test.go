package storecheck_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/storecheck"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fileOptions are the two ways meshnode opens bbolt: the outbox without a
// stored free list (rebuilt at open by scanning, in a goroutine of
// bbolt's), the inbox with one.
var fileOptions = map[string]*bolt.Options{
	"no-freelist-sync": {Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType},
	"freelist-synced":  {Timeout: time.Second},
}

// makeFile writes a bbolt file with what meshnode's files hold: nested
// buckets, inline buckets, many small keys (branch pages), values large
// enough for overflow pages, bucket sequences, and freed pages.
func makeFile(tb testing.TB, path string, opts *bolt.Options) {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil {
		tb.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		q, err := tx.CreateBucket([]byte("q"))
		if err != nil {
			return err
		}
		for r := 0; r < 5; r++ {
			b, err := q.CreateBucket([]byte(fmt.Sprintf("actor%d@n2", r)))
			if err != nil {
				return err
			}
			_ = b.SetSequence(uint64(100 + r))
			for i := 0; i < 300*r; i++ {
				if err := b.Put(binary.BigEndian.AppendUint64(nil, uint64(i)), bytes.Repeat([]byte{byte(i)}, 40)); err != nil {
					return err
				}
			}
		}
		big, err := tx.CreateBucket([]byte("big"))
		if err != nil {
			return err
		}
		for i := 0; i < 3; i++ {
			if err := big.Put([]byte{byte(i)}, bytes.Repeat([]byte{'v'}, 20000)); err != nil {
				return err
			}
		}
		meta, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		return meta.Put([]byte("outbox_id"), bytes.Repeat([]byte{7}, 16))
	})
	if err == nil {
		// Free some pages: delete half of a large bucket.
		err = db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("q")).Bucket([]byte("actor4@n2"))
			c := b.Cursor()
			for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) < 600; k, _ = c.First() {
				if err := c.Delete(); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// readAll opens path with bbolt as meshnode would and reads every key:
// what must not crash once Check passed.
func readAll(tb testing.TB, path string, opts *bolt.Options) int {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, opts)
	if err != nil {
		return -1 // refusing is fine; crashing is not
	}
	defer func() { _ = db.Close() }()
	n := 0
	var walk func(b *bolt.Bucket) error
	walk = func(b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(b.Bucket(k))
			}
			n++
			return nil
		})
	}
	_ = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walk(b) })
	})
	return n
}

func TestHealthyFilesPass(t *testing.T) {
	for name, opts := range fileOptions {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.db")
			makeFile(t, path, opts)
			r, err := storecheck.Check(path)
			if err != nil {
				t.Fatalf("a healthy file: %v", err)
			}
			if want := int64(readAll(t, path, opts)); r.Keys != want || r.Buckets != 8 {
				t.Fatalf("report %+v: keys %d, want %d; buckets %d, want 8", r, r.Keys, want, r.Buckets)
			}
		})
	}
}

// corruptions damage a healthy file the ways a disk, a copy or a person
// does. Each must be refused by Check, or, if Check passes it, be
// something bbolt reads without crashing.
func corruptions(pageSize int) []struct {
	name string
	f    func(b []byte) []byte
} {
	put64 := func(b []byte, off int, v uint64) { binary.NativeEndian.PutUint64(b[off:], v) }
	return []struct {
		name string
		f    func(b []byte) []byte
	}{
		{"truncated to zero", func(b []byte) []byte { return b[:0] }},
		{"truncated to one page", func(b []byte) []byte { return b[:pageSize] }},
		{"truncated to half", func(b []byte) []byte { return b[:len(b)/2/pageSize*pageSize] }},
		{"truncated mid-page", func(b []byte) []byte { return b[:len(b)-pageSize/2] }},
		{"meta 0 garbage", func(b []byte) []byte { copy(b[16:80], bytes.Repeat([]byte{0xab}, 64)); return b }},
		{"both metas garbage", func(b []byte) []byte {
			copy(b[16:80], bytes.Repeat([]byte{0xab}, 64))
			copy(b[pageSize+16:pageSize+80], bytes.Repeat([]byte{0xab}, 64))
			return b
		}},
		{"page 3 says it is page 0", func(b []byte) []byte { put64(b, 3*pageSize, 0); return b }},
		{"every page id zeroed", func(b []byte) []byte {
			for p := 2; p*pageSize < len(b); p++ {
				put64(b, p*pageSize, 0)
			}
			return b
		}},
		{"page types scrambled", func(b []byte) []byte {
			for p := 2; p*pageSize < len(b); p++ {
				binary.NativeEndian.PutUint16(b[p*pageSize+8:], 0x7)
			}
			return b
		}},
		{"element counts huge", func(b []byte) []byte {
			for p := 2; p*pageSize < len(b); p++ {
				binary.NativeEndian.PutUint16(b[p*pageSize+10:], 0xfffe)
			}
			return b
		}},
		{"overflow huge", func(b []byte) []byte {
			for p := 2; p*pageSize < len(b); p++ {
				binary.NativeEndian.PutUint32(b[p*pageSize+12:], 0xffffff)
			}
			return b
		}},
		{"element offsets out of the page", func(b []byte) []byte {
			for p := 2; p*pageSize < len(b); p++ {
				binary.NativeEndian.PutUint32(b[p*pageSize+16+4:], 0x7fffffff)
			}
			return b
		}},
		{"second half zeroed", func(b []byte) []byte { clear(b[len(b)/2:]); return b }},
		{"random bytes in every page body", func(b []byte) []byte {
			x := uint32(12345)
			for i := 2 * pageSize; i < len(b); i++ {
				if i%pageSize >= 16 && i%97 == 0 {
					x = x*1664525 + 1013904223
					b[i] = byte(x >> 24)
				}
			}
			return b
		}},
		{"a page copied over another", func(b []byte) []byte {
			if len(b) >= 6*pageSize {
				copy(b[5*pageSize:6*pageSize], b[4*pageSize:5*pageSize])
			}
			return b
		}},
		{"a branch points at a meta page", func(b []byte) []byte {
			for p := 2; p*pageSize < len(b); p++ {
				if binary.NativeEndian.Uint16(b[p*pageSize+8:]) == 0x01 {
					put64(b, p*pageSize+16+8, 1)
					break
				}
			}
			return b
		}},
	}
}

func TestCorruptFilesNeverCrash(t *testing.T) {
	for name, opts := range fileOptions {
		for _, c := range corruptions(os.Getpagesize()) {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "s.db")
				makeFile(t, path, opts)
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, c.f(b), 0o600); err != nil {
					t.Fatal(err)
				}
				if _, err := storecheck.Check(path); err != nil {
					t.Logf("refused: %v", err)
					if !errors.Is(err, storecheck.ErrDamaged) {
						t.Fatalf("Check = %v, want ErrDamaged", err)
					}
					// Salvage never crashes either, and writes a file bbolt
					// opens and Check passes.
					out := filepath.Join(t.TempDir(), "salvaged.db")
					if _, err := storecheck.Salvage(path, out); err == nil {
						if _, err := storecheck.Check(out); err != nil {
							t.Fatalf("salvaged file: %v", err)
						}
					}
					return
				}
				t.Logf("passed; bbolt reads %d keys", readAll(t, path, opts)) // must not crash
			})
		}
	}
}

// TestSalvageCopiesWhatIsReadable: a file with one page destroyed gives a
// new file with everything else.
func TestSalvageCopiesWhatIsReadable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	makeFile(t, path, fileOptions["no-freelist-sync"])
	want := readAll(t, path, fileOptions["no-freelist-sync"])
	clean := filepath.Join(t.TempDir(), "clean.db")
	rep, err := storecheck.Salvage(path, clean)
	if err != nil || rep.Keys != int64(want) || !rep.Source.OK() {
		t.Fatalf("salvage of a healthy file: %+v %v, want %d keys", rep, err, want)
	}
	b, _ := os.ReadFile(path)
	ps := os.Getpagesize()
	// Destroy the last page that holds leaf elements of a q bucket.
	for p := len(b)/ps - 1; p >= 2; p-- {
		if binary.NativeEndian.Uint16(b[p*ps+8:]) == 0x02 && binary.NativeEndian.Uint16(b[p*ps+10:]) > 10 {
			binary.NativeEndian.PutUint64(b[p*ps:], 0)
			break
		}
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "salvaged.db")
	rep, err = storecheck.Salvage(path, out)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Source.OK() || rep.Keys == 0 || rep.Keys >= int64(want) {
		t.Fatalf("salvage: %+v; want some but not all of %d keys", rep, want)
	}
	if got := readAll(t, out, fileOptions["no-freelist-sync"]); got != int(rep.Keys) {
		t.Fatalf("the salvaged file holds %d keys, report says %d", got, rep.Keys)
	}
	// Sequences survive.
	db, err := bolt.Open(out, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	_ = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte("q")).Bucket([]byte("actor2@n2")); b == nil || b.Sequence() != 102 {
			t.Errorf("bucket sequence not kept")
		}
		return nil
	})
}

func TestBeforeAndMarkers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.db")
	o, err := storecheck.Before(path, time.Second)
	if err != nil || !o.New {
		t.Fatalf("no file yet: %+v %v, want a new store", o, err)
	}
	makeFile(t, path, fileOptions["freelist-synced"])
	if err := storecheck.Identify(path, []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := storecheck.Identify(path, []byte{1, 2}); err != nil {
		t.Fatalf("same identity: %v", err)
	}
	if err := storecheck.Identify(path, []byte{3}); !errors.Is(err, storecheck.ErrReplaced) {
		t.Fatalf("another identity: %v, want ErrReplaced", err)
	}
	if o, err := storecheck.Before(path, time.Second); err != nil || o.Clean || o.New {
		t.Fatalf("no clean marker: %+v %v, want checked as unclean", o, err)
	}
	if err := storecheck.MarkClean(path); err != nil {
		t.Fatal(err)
	}
	if o, err := storecheck.Before(path, time.Second); err != nil || !o.Clean {
		t.Fatalf("after MarkClean: %+v %v, want clean", o, err)
	}
	if _, err := os.Stat(storecheck.CleanPath(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("Before left the clean marker: a crash now would look clean")
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := storecheck.Before(path, time.Second); !errors.Is(err, storecheck.ErrLost) {
		t.Fatalf("emptied file: %v, want ErrLost", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := storecheck.Before(path, time.Second); !errors.Is(err, storecheck.ErrLost) {
		t.Fatalf("missing file: %v, want ErrLost", err)
	}
	if err := storecheck.Forget(path); err != nil {
		t.Fatal(err)
	}
	if o, err := storecheck.Before(path, time.Second); err != nil || !o.New {
		t.Fatalf("after Forget: %+v %v, want a new store", o, err)
	}
}

// FuzzCheck: whatever the file holds, Check and Salvage never panic, and
// a file Check passes is one bbolt opens (rebuilding its free list by
// scanning) and reads without crashing.
func FuzzCheck(f *testing.F) {
	dir := f.TempDir()
	for name, opts := range fileOptions {
		path := filepath.Join(dir, name)
		db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, PageSize: 1024,
			NoFreelistSync: opts.NoFreelistSync, FreelistType: opts.FreelistType})
		if err != nil {
			f.Fatal(err)
		}
		_ = db.Update(func(tx *bolt.Tx) error {
			b, _ := tx.CreateBucket([]byte("q"))
			n, _ := b.CreateBucket([]byte("a@b"))
			for i := 0; i < 60; i++ {
				_ = n.Put([]byte{byte(i)}, bytes.Repeat([]byte{byte(i)}, 30))
			}
			_ = b.Put([]byte("big"), bytes.Repeat([]byte{'x'}, 1500))
			return nil
		})
		_ = db.Close()
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, opts.NoFreelistSync)
	}
	f.Fuzz(func(t *testing.T, b []byte, noFreelistSync bool) {
		path := filepath.Join(t.TempDir(), "f.db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _ = storecheck.Salvage(path, filepath.Join(t.TempDir(), "out.db"))
		if _, err := storecheck.Check(path); err != nil {
			return
		}
		opts := &bolt.Options{Timeout: time.Second}
		if noFreelistSync {
			opts.NoFreelistSync, opts.FreelistType = true, bolt.FreelistMapType
		}
		readAll(t, path, opts)
	})
}

// TestInlineBucketsPointingAtEachOther: the elements of a leaf may all
// point at the same value, an inline bucket whose elements all point at
// the same inline bucket inside it, and so on: a naive walk is k^depth.
// The check stops and refuses the file.
func TestInlineBucketsPointingAtEachOther(t *testing.T) {
	const ps, k, depth = 4096, 8, 30
	order := binary.NativeEndian
	// inline returns a bucket value (header + inline leaf) whose k
	// elements are all the bucket "k" with value next.
	inline := func(next []byte) []byte {
		v := make([]byte, 32+16*k+1+len(next))
		order.PutUint16(v[16+8:], 0x02) // the inline page: a leaf
		if next != nil {
			order.PutUint16(v[16+10:], k)
			for i := 0; i < k; i++ {
				e := v[32+16*i:]
				order.PutUint32(e[0:], 1)                // a bucket
				order.PutUint32(e[4:], uint32(16*(k-i))) // the key, after the elements
				order.PutUint32(e[8:], 1)
				order.PutUint32(e[12:], uint32(len(next)))
			}
			v[32+16*k] = 'k'
			copy(v[32+16*k+1:], next)
		}
		return v
	}
	var v []byte
	for d := 0; d < depth; d++ {
		v = inline(v)
	}
	b := make([]byte, 6*ps)
	for i := 0; i < 2; i++ {
		p := b[i*ps:]
		order.PutUint64(p[0:], uint64(i))
		order.PutUint16(p[8:], 0x04)
		m := p[16:]
		order.PutUint32(m[0:], 0xED0CDAED)
		order.PutUint32(m[4:], 2)
		order.PutUint32(m[8:], ps)
		order.PutUint64(m[16:], 2)          // root
		order.PutUint64(m[32:], ^uint64(0)) // no free list
		order.PutUint64(m[40:], 6)          // high water
		order.PutUint64(m[48:], uint64(i))  // txid
		h := fnv.New64a()
		h.Write(m[:56])
		order.PutUint64(m[56:], h.Sum64())
	}
	// Page 2 (with 3 overflow pages): the root leaf, k elements all the
	// bucket "k" with value v.
	p := b[2*ps:]
	order.PutUint64(p[0:], 2)
	order.PutUint16(p[8:], 0x02)
	order.PutUint16(p[10:], k)
	order.PutUint32(p[12:], 3)
	for i := 0; i < k; i++ {
		e := p[16+16*i:]
		order.PutUint32(e[0:], 1)
		order.PutUint32(e[4:], uint32(16*(k-i)))
		order.PutUint32(e[8:], 1)
		order.PutUint32(e[12:], uint32(len(v)))
	}
	p[16+16*k] = 'k'
	if n := copy(p[16+16*k+1:], v); n != len(v) {
		t.Fatalf("the value of %d bytes does not fit", len(v))
	}
	path := filepath.Join(t.TempDir(), "loop.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []func() error{
		func() error { _, err := storecheck.Check(path); return err },
		func() error { _, err := storecheck.Salvage(path, filepath.Join(t.TempDir(), "out.db")); return err },
	} {
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			t.Log(err)
		case <-time.After(10 * time.Second):
			t.Fatal("the walk did not finish: it is exponential")
		}
	}
	if _, err := storecheck.Check(path); !errors.Is(err, storecheck.ErrDamaged) {
		t.Fatalf("Check = %v, want ErrDamaged", err)
	}
}

package storecheck

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"strings"
	"time"
)

// The bbolt file format (go.etcd.io/bbolt internal/common), in the
// machine's byte order as bbolt writes it.
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	pageHeaderSize = 16 // id u64, flags u16, count u16, overflow u32
	elemSize       = 16 // branch: pos u32, ksize u32, pgid u64; leaf: flags u32, pos u32, ksize u32, vsize u32
	metaSize       = 64 // magic, version, pageSize, flags u32; root, sequence, freelist, pgid, txid, checksum u64
	metaSumOffset  = 56
	bucketHeader   = 16 // root u64, sequence u64

	flagBranch   = 0x01
	flagLeaf     = 0x02
	flagMeta     = 0x04
	flagFreelist = 0x10
	leafBucket   = 0x01

	noFreelist = ^uint64(0)

	maxDepth    = 64 // a B+tree of bbolt pages is a few levels deep; more is a cycle or garbage
	maxProblems = 20 // listed in a Report; the rest are counted
)

var order = binary.NativeEndian

// Report is what Check found.
type Report struct {
	Size      int64    // file size in bytes
	PageSize  int      // from the meta page in use
	HighWater uint64   // pages below the high-water mark
	Pages     int64    // pages reachable from the root (meta and free-list pages included)
	Buckets   int      // buckets, nested ones included
	Keys      int64    // keys that are not buckets
	Problems  []string // the first problems found
	More      int      // problems found beyond those listed
}

// OK reports whether no problem was found.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

func (r *Report) problem(format string, args ...any) {
	if len(r.Problems) < maxProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
		return
	}
	r.More++
}

// Err returns nil for a report without problems, else an error wrapping
// ErrDamaged that lists the first few.
func (r *Report) Err() error {
	if r.OK() {
		return nil
	}
	first := r.Problems
	if len(first) > 3 {
		first = first[:3]
	}
	more := len(r.Problems) - len(first) + r.More
	msg := strings.Join(first, "; ")
	if more > 0 {
		msg += fmt.Sprintf(" (and %d more)", more)
	}
	return fmt.Errorf("%w: %s", ErrDamaged, msg)
}

// Check reads the bbolt file at path and verifies what bbolt would trust,
// the key order included (see the package doc). It never writes and never
// panics. The error is an I/O error or Report.Err().
func Check(path string) (Report, error) {
	return checkLocked(path, 0)
}

// checkLocked is Check under a shared lock of the file, so that a process
// writing it meanwhile is not mistaken for damage: ErrBusy when the lock
// cannot be had within timeout.
func checkLocked(path string, timeout time.Duration) (Report, error) {
	var r Report
	f, err := os.Open(path)
	if err != nil {
		return r, fmt.Errorf("storecheck: %w", err)
	}
	defer func() { _ = f.Close() }() // also releases the lock
	if err := lockShared(f, timeout); err != nil {
		return r, err
	}
	w, err := newWalker(f, &r, false)
	if err != nil {
		return r, err
	}
	w.deep = true
	w.walk()
	return r, r.Err()
}

// walker reads one file's pages and walks its buckets.
type walker struct {
	f     io.ReaderAt
	r     *Report
	deep  bool // check the key order (Check; Salvage copies in any order)
	meta  meta
	reach []uint64 // bitset of reachable pages, HighWater bits
	// budget is how many more elements the walk may decode. Every element
	// of a sound file takes 16 bytes of it, so there can be no more than
	// its size / 16; more means elements of inline buckets that point at
	// each other's bytes, which would make the walk exponential.
	budget int64

	// visit, when set, is called for every readable key and value (path is
	// the bucket's, outermost first), and bucket for every bucket with its
	// sequence. Salvage sets them; the slices are only valid during the call.
	visit  func(path [][]byte, k, v []byte)
	bucket func(path [][]byte, seq uint64)
}

type meta struct {
	pageSize                      int
	root, seq, freelist, hw, txid uint64
}

// newWalker reads the meta pages as bbolt would choose between them.
// lenient (salvage) goes on with a high-water mark cut to the file's end.
func newWalker(f *os.File, r *Report, lenient bool) (*walker, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("storecheck: %w", err)
	}
	r.Size = st.Size()
	w := &walker{f: f, r: r}
	if r.Size == 0 {
		r.problem("the file is empty")
		return nil, r.Err()
	}
	m0, ok0 := w.readMeta(0)
	pageSize := m0.pageSize
	if !ok0 {
		// Find the second meta at the page sizes bbolt would try.
		for i := 0; i <= 14; i++ {
			pos := int64(1024) << i
			if pos >= r.Size-1024 {
				break
			}
			if m, ok := w.readMeta(pos); ok {
				pageSize = m.pageSize
				break
			}
		}
	}
	var m1 meta
	var ok1 bool
	if pageSize > 0 {
		m1, ok1 = w.readMeta(int64(pageSize))
	}
	switch {
	case !ok0 && !ok1:
		r.problem("neither meta page is valid (magic, version or checksum)")
		return nil, r.Err()
	case ok0 && ok1 && m1.txid > m0.txid, !ok0:
		w.meta = m1
	default:
		w.meta = m0
	}
	m := w.meta
	r.PageSize, r.HighWater = m.pageSize, m.hw
	switch {
	case m.hw < 2:
		r.problem("high-water mark %d is below the two meta pages", m.hw)
	case m.hw > uint64(r.Size)/uint64(m.pageSize):
		r.problem("high-water mark %d pages (%d bytes) is beyond the end of the file (%d bytes): the file was truncated",
			m.hw, m.hw*uint64(m.pageSize), r.Size)
		if lenient {
			w.meta.hw = uint64(r.Size) / uint64(m.pageSize)
		}
	case m.root < 2 || m.root >= m.hw:
		r.problem("root page %d is outside [2, %d)", m.root, m.hw)
	}
	if !r.OK() && (!lenient || w.meta.root >= w.meta.hw) {
		return nil, r.Err()
	}
	w.reach = make([]uint64, (w.meta.hw+63)/64)
	w.budget = r.Size/elemSize + 1
	return w, nil
}

// readMeta reads and validates the meta page at offset off.
func (w *walker) readMeta(off int64) (meta, bool) {
	var b [pageHeaderSize + metaSize]byte
	if n, err := w.f.ReadAt(b[:], off); n != len(b) && err != nil {
		return meta{}, false
	}
	mb := b[pageHeaderSize:]
	h := fnv.New64a()
	h.Write(mb[:metaSumOffset])
	if order.Uint32(mb[0:]) != boltMagic || order.Uint32(mb[4:]) != boltVersion || order.Uint64(mb[metaSumOffset:]) != h.Sum64() {
		return meta{}, false
	}
	ps := int(order.Uint32(mb[8:]))
	if ps < 512 || ps > 1<<20 || ps&(ps-1) != 0 {
		return meta{}, false
	}
	return meta{pageSize: ps, root: order.Uint64(mb[16:]), seq: order.Uint64(mb[24:]), freelist: order.Uint64(mb[32:]),
		hw: order.Uint64(mb[40:]), txid: order.Uint64(mb[48:])}, true
}

// walk checks the whole file.
func (w *walker) walk() {
	w.mark(0, 0)
	w.mark(1, 0)
	var freed []uint64
	if fl := w.meta.freelist; fl != noFreelist {
		freed = w.freelist(fl)
	}
	w.tree(w.meta.root, nil, 0, nil, nil)
	for _, id := range freed {
		if w.reachable(id) {
			w.r.problem("page %d is both free and in use", id)
		}
	}
}

func (w *walker) reachable(id uint64) bool { return id < w.meta.hw && w.reach[id/64]&(1<<(id%64)) != 0 }

// mark records pages id..id+overflow as reachable; false when one already
// was (a second reference).
func (w *walker) mark(id uint64, overflow uint32) bool {
	ok := true
	for i := uint64(0); i <= uint64(overflow); i++ {
		p := id + i
		if w.reachable(p) {
			ok = false
		}
		w.reach[p/64] |= 1 << (p % 64)
	}
	if ok {
		w.r.Pages += int64(overflow) + 1
	}
	return ok
}

// page reads page id with its overflow pages, checking that it is what it
// claims to be and lies within the file and the high-water mark.
func (w *walker) page(id uint64, where string) []byte {
	ps := uint64(w.meta.pageSize)
	if id < 2 || id >= w.meta.hw {
		w.r.problem("%s: page %d is outside [2, %d)", where, id, w.meta.hw)
		return nil
	}
	var h [pageHeaderSize]byte
	if _, err := w.f.ReadAt(h[:], int64(id*ps)); err != nil {
		w.r.problem("%s: page %d cannot be read: %v", where, id, err)
		return nil
	}
	if got := order.Uint64(h[0:]); got != id {
		w.r.problem("%s: page %d says it is page %d", where, id, got)
		return nil
	}
	overflow := order.Uint32(h[12:])
	if id+uint64(overflow) >= w.meta.hw || (id+uint64(overflow)+1)*ps > uint64(w.r.Size) {
		w.r.problem("%s: page %d with %d overflow pages runs past the end", where, id, overflow)
		return nil
	}
	if !w.mark(id, overflow) {
		w.r.problem("%s: page %d is referenced twice", where, id)
		return nil
	}
	n := (uint64(overflow) + 1) * ps
	if n > math.MaxInt {
		// Within the file, but past what this platform reads at once (an
		// int of 32 bits): no healthy store has such a page.
		w.r.problem("%s: page %d of %d bytes is larger than this platform can read", where, id, n)
		return nil
	}
	if overflow > 0 {
		// Read no more than the page's elements use: one damaged
		// overflow count must not cost an allocation the size of the file
		// (a small board checking a large store). A page whose elements
		// run past its end is read whole, and refused as before.
		n = w.extent(id, n)
	}
	b := make([]byte, n)
	if _, err := w.f.ReadAt(b, int64(id*ps)); err != nil && !errors.Is(err, io.EOF) {
		w.r.problem("%s: page %d cannot be read: %v", where, id, err)
		return nil
	}
	return b
}

// extent returns how many bytes of page id (n in all, with its overflow)
// hold its elements and their keys and values, or its free list's ids: n
// when they claim more, or the page's type has neither. It reads the
// page's header and element array; what it cannot read, page reports.
func (w *walker) extent(id, n uint64) uint64 {
	off := int64(id) * int64(w.meta.pageSize)
	var h [pageHeaderSize + 8]byte
	if _, err := w.f.ReadAt(h[:], off); err != nil {
		return n
	}
	flags, count := order.Uint16(h[8:]), uint64(order.Uint16(h[10:]))
	var end uint64
	switch flags {
	case flagFreelist:
		idx := uint64(0)
		if count == 0xFFFF {
			idx, count = 1, order.Uint64(h[pageHeaderSize:])
		}
		if count > n/8 {
			return n
		}
		end = pageHeaderSize + (idx+count)*8
	case flagBranch, flagLeaf:
		end = pageHeaderSize + count*elemSize
		if end > n {
			return n
		}
		es := make([]byte, end-pageHeaderSize)
		if _, err := w.f.ReadAt(es, off+pageHeaderSize); err != nil {
			return n
		}
		for i := uint64(0); i < count; i++ {
			e := es[i*elemSize:]
			var last uint64 // where the element's key, or key and value, end
			if flags == flagBranch {
				last = pageHeaderSize + i*elemSize + uint64(order.Uint32(e[0:])) + uint64(order.Uint32(e[4:]))
			} else {
				last = pageHeaderSize + i*elemSize + uint64(order.Uint32(e[4:])) + uint64(order.Uint32(e[8:])) + uint64(order.Uint32(e[12:]))
			}
			end = max(end, last)
		}
	default:
		return n
	}
	return min(end, n)
}

// freelist checks a stored free list and returns its page ids.
func (w *walker) freelist(id uint64) []uint64 {
	b := w.page(id, "free list")
	if b == nil {
		return nil
	}
	if flags := order.Uint16(b[8:]); flags != flagFreelist {
		w.r.problem("free list: page %d has type %#x, not a free list", id, flags)
		return nil
	}
	idx, count := uint64(0), uint64(order.Uint16(b[10:]))
	if count == 0xFFFF {
		if len(b) < pageHeaderSize+8 {
			w.r.problem("free list: page %d is too short for its count", id)
			return nil
		}
		idx, count = 1, order.Uint64(b[pageHeaderSize:])
	}
	if count > uint64(len(b)-pageHeaderSize)/8 || (idx+count)*8 > uint64(len(b)-pageHeaderSize) {
		w.r.problem("free list: page %d claims %d ids, more than it holds", id, count)
		return nil
	}
	ids := make([]uint64, 0, count)
	seen := make(map[uint64]bool, count)
	for i := idx; i < idx+count; i++ {
		p := order.Uint64(b[pageHeaderSize+i*8:])
		switch {
		case p < 2 || p >= w.meta.hw:
			w.r.problem("free list: page %d is outside [2, %d)", p, w.meta.hw)
		case seen[p]:
			w.r.problem("free list: page %d is listed twice", p)
		default:
			seen[p] = true
			ids = append(ids, p)
		}
	}
	return ids
}

// elem is one element of a branch or leaf page.
type elem struct {
	flags uint32
	key   []byte
	value []byte // leaf
	child uint64 // branch
}

// elems decodes the elements of page b (a branch or a leaf).
func (w *walker) elems(b []byte, id uint64, where string) ([]elem, bool) {
	flags, count := order.Uint16(b[8:]), int(order.Uint16(b[10:]))
	if flags != flagBranch && flags != flagLeaf {
		w.r.problem("%s: page %d has type %#x, not a branch or a leaf", where, id, flags)
		return nil, false
	}
	if flags == flagBranch && count == 0 {
		w.r.problem("%s: branch page %d has no elements", where, id)
		return nil, false
	}
	if pageHeaderSize+count*elemSize > len(b) {
		w.r.problem("%s: page %d claims %d elements, more than it holds", where, id, count)
		return nil, false
	}
	if w.budget -= int64(count); w.budget < 0 {
		if w.budget+int64(count) >= 0 { // say it once
			w.r.problem("%s: page %d: more elements than the file can hold: inline buckets point at each other", where, id)
		}
		return nil, false
	}
	out := make([]elem, count)
	for i := range out {
		e := b[pageHeaderSize+i*elemSize:]
		base := uint64(pageHeaderSize + i*elemSize)
		if flags == flagBranch {
			pos, ksize := uint64(order.Uint32(e[0:])), uint64(order.Uint32(e[4:]))
			if base+pos+ksize > uint64(len(b)) {
				w.r.problem("%s: page %d element %d points outside the page", where, id, i)
				return nil, false
			}
			if ksize == 0 {
				w.r.problem("%s: page %d element %d has an empty key", where, id, i)
				return nil, false
			}
			out[i] = elem{key: b[base+pos : base+pos+ksize], child: order.Uint64(e[8:])}
			continue
		}
		pos, ksize, vsize := uint64(order.Uint32(e[4:])), uint64(order.Uint32(e[8:])), uint64(order.Uint32(e[12:]))
		if base+pos+ksize+vsize > uint64(len(b)) {
			w.r.problem("%s: page %d element %d points outside the page", where, id, i)
			return nil, false
		}
		if ksize == 0 {
			// bbolt never writes one, and asserts on one it reads for a write.
			w.r.problem("%s: page %d element %d has an empty key", where, id, i)
			return nil, false
		}
		k := b[base+pos : base+pos+ksize]
		out[i] = elem{flags: order.Uint32(e[0:]), key: k, value: b[base+pos+ksize : base+pos+ksize+vsize]}
	}
	return out, true
}

// tree walks the page tree rooted at id of the bucket at path. Keys must be
// >= lo and < hi (nil: unbounded); it returns the largest key seen.
func (w *walker) tree(id uint64, path [][]byte, depth int, lo, hi []byte) []byte {
	where := describe(path)
	if depth > maxDepth {
		w.r.problem("%s: pages nest deeper than %d at page %d", where, maxDepth, id)
		return nil
	}
	b := w.page(id, where)
	if b == nil {
		return nil
	}
	es, ok := w.elems(b, id, where)
	if !ok {
		return nil
	}
	if order.Uint16(b[8:]) == flagBranch {
		run := lo
		for i, e := range es {
			w.order(where, id, i, e.key, run, hi)
			next := hi
			if i+1 < len(es) {
				next = es[i+1].key
			}
			if max := w.tree(e.child, path, depth+1, e.key, next); max != nil {
				run = max
			}
		}
		return run
	}
	return w.leaf(es, id, path, depth, lo, hi)
}

// leaf handles the elements of a leaf page: keys, values and sub-buckets.
func (w *walker) leaf(es []elem, id uint64, path [][]byte, depth int, lo, hi []byte) []byte {
	where := describe(path)
	run := lo
	for i, e := range es {
		w.order(where, id, i, e.key, run, hi)
		run = e.key
		if e.flags&leafBucket == 0 {
			w.r.Keys++
			if w.visit != nil {
				w.visit(path, e.key, e.value)
			}
			continue
		}
		sub := append(append([][]byte(nil), path...), e.key)
		if len(e.value) < bucketHeader {
			w.r.problem("%s: bucket value of %d bytes is shorter than its header", describe(sub), len(e.value))
			continue
		}
		w.r.Buckets++
		root, seq := order.Uint64(e.value[0:]), order.Uint64(e.value[8:])
		if w.bucket != nil {
			w.bucket(sub, seq)
		}
		if root != 0 {
			w.tree(root, sub, depth+1, nil, nil)
			continue
		}
		inline := e.value[bucketHeader:]
		if len(inline) < pageHeaderSize {
			w.r.problem("%s: inline bucket of %d bytes is shorter than a page header", describe(sub), len(inline))
			continue
		}
		if flags := order.Uint16(inline[8:]); flags != flagLeaf {
			w.r.problem("%s: inline bucket page has type %#x, not a leaf", describe(sub), flags)
			continue
		}
		if ies, ok := w.elems(inline, 0, describe(sub)); ok {
			w.leaf(ies, 0, sub, depth+1, nil, nil)
		}
	}
	if len(es) > 0 {
		return es[len(es)-1].key
	}
	return nil
}

// order checks the i-th key of a page against the one before (prev) and
// the upper bound of its parent (hi), when the walk checks the order.
func (w *walker) order(where string, id uint64, i int, key, prev, hi []byte) {
	if !w.deep {
		return
	}
	if prev != nil && (bytes.Compare(prev, key) > 0 || (i > 0 && bytes.Equal(prev, key))) {
		w.r.problem("%s: page %d key %d (%x) is not after the key before it (%x)", where, id, i, short(key), short(prev))
	}
	if hi != nil && bytes.Compare(key, hi) >= 0 {
		w.r.problem("%s: page %d key %d (%x) is not before its parent's next key (%x)", where, id, i, short(key), short(hi))
	}
}

func short(b []byte) []byte {
	if len(b) > 16 {
		return b[:16]
	}
	return b
}

// describe names a bucket path for a problem.
func describe(path [][]byte) string {
	if len(path) == 0 {
		return "root"
	}
	parts := make([]string, len(path))
	for i, p := range path {
		parts[i] = fmt.Sprintf("%q", short(p))
	}
	return "bucket " + strings.Join(parts, "/")
}

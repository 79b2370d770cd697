// Package storecheck looks after meshnode's bbolt files (the outbox and the
// inbox) before bbolt is trusted with them, and salvages damaged ones. It
// is not public API; outbox, internal/inbox and `meshnode doctor` use it.
//
// bbolt trusts its file: a page that says it is another page, an element
// that points outside its page or a page referenced twice make it panic
// (an assertion in the caller's goroutine), fault (a read past the end of
// its memory map) or, with NoFreelistSync, panic in a goroutine it starts
// while rebuilding the free list, which no caller can recover. So Check
// reads the file itself, with bounds checks on every field, never through
// bbolt, and refuses what bbolt would trip on:
//
//   - both meta pages invalid (magic, version, checksum), a page size that
//     is not a power of two in [512 B, 1 MiB], a high-water mark beyond
//     the file;
//   - a page reachable from the root that is out of bounds, past the end
//     of the file, not the page it claims to be, neither a branch nor a
//     leaf, referenced twice, an empty branch, or whose elements point
//     outside it or have an empty key; an inline bucket whose page does
//     not fit its value; a
//     stored free list that is out of bounds, has duplicates or frees a
//     reachable page;
//   - keys out of order within a page or against the keys of its parent,
//     as bbolt's own Tx.Check would report: bbolt, opening a file without a
//     stored free list (as the outbox does), panics on them while it
//     rebuilds the list. (Salvage copies what it can read, in any order.)
//
// The structural check costs about one read of the used part of the file,
// as much as bbolt itself spends at open when it rebuilds the free list.
//
// Around it, Before and MarkClean keep a clean-shutdown marker (<file>.clean,
// written after a clean close, removed at open: its absence means the last
// run did not end cleanly, which the stores log), and Identify keeps
// the store's identity in <file>.id, so a store that disappeared or was
// emptied (ErrLost) or replaced by another one (ErrReplaced) is noticed
// instead of starting empty. Salvage copies every readable bucket, key and
// value of a damaged file into a new one.
package storecheck

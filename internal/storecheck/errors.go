package storecheck

import "errors"

// Sentinels. Callers wrap them with what to do about it.
var (
	// ErrDamaged: the file's structure is broken; bbolt must not open it.
	ErrDamaged = errors.New("store file is damaged")
	// ErrLost: the file is missing or empty, but this data directory had a
	// store (its identity file says so): its data would silently be gone.
	ErrLost = errors.New("store file is missing or was emptied")
	// ErrReplaced: the file is another store than the one this data
	// directory had (its identity differs).
	ErrReplaced = errors.New("store file belongs to another store")
	// ErrBusy: another process holds the file; it was not checked.
	ErrBusy = errors.New("store file is in use by another process")
)

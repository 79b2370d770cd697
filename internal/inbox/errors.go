package inbox

import (
	"errors"

	"github.com/meshnode/meshnode/internal/storecheck"
)

// Sentinels of the inbox store. Check them with errors.Is.
var (
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("inbox: closed")
	// ErrLocked: another process holds the inbox file (another meshnode on
	// the same data directory).
	ErrLocked = errors.New("inbox: data file is locked by another process")
	// ErrNoSuchInbox: the inbox was never declared.
	ErrNoSuchInbox = errors.New("inbox: no such inbox")
	// ErrFull: the inbox holds MaxMessages unacknowledged messages; the
	// sender should back off until the program acknowledges some.
	ErrFull = errors.New("inbox: full")
	// ErrWrite: the inbox file refused a write (a full or failing disk);
	// nothing of the call was stored. It may work later.
	ErrWrite = errors.New("inbox: write failed")
	// ErrFailed: the store stopped because the disk failed a commit after
	// bbolt had written it into the file (its fsync, most likely): what
	// survives a crash is unknown. Every write and Pull fails with it (as
	// ErrWrite too, so senders back off) until the store is reopened.
	ErrFailed = errors.New("inbox: store failed: the disk failed a commit it had already written; restart to reopen the file")
	// ErrAckBeyond: an ack names a cursor past the last stored message; the
	// watermark never passes durable work.
	ErrAckBeyond = errors.New("inbox: ack beyond the last stored message")
	// ErrPullBeyond: a pull asks for messages after a cursor that was never
	// handed out; waiting there would skip the messages stored in between.
	ErrPullBeyond = errors.New("inbox: pull after a cursor beyond the last stored message")
	// ErrBadName: an inbox name is empty, too long, has a character other
	// than ASCII letters, digits, '-', '_', '.', ':', is only dots or is a
	// Windows device name.
	ErrBadName = errors.New("inbox: bad name")
	// ErrBadConfig: Config.Validate refused the configuration.
	ErrBadConfig = errors.New("inbox: bad config")
	// ErrDamaged: the file's structure is broken; it is not opened.
	ErrDamaged = storecheck.ErrDamaged
	// ErrLost: the file is missing or empty but the data directory had an
	// inbox (recorded in inbox.db.id).
	ErrLost = storecheck.ErrLost
	// ErrReplaced: the file is another inbox than the one its data
	// directory had.
	ErrReplaced = storecheck.ErrReplaced
)

package main

import (
	"testing"
)

// The TOML decoder (BurntSushi/toml v1.6.0) range-checks int8, int16
// and int32 fields but not int: where an int has 32 bits it stores
// int(v), the low 32 bits. inbox_capacity = 4294967396 (2^32 + 100, a
// 64-bit board's "practically unbounded") loads as 100 and
// mailbox_capacity = 4294967297 as 1, both positive, so Validate takes
// them: the daemon runs with 1-place mailboxes and 100-message inboxes
// and says nothing. The same numbers given as MESHNODE_* or as flags are
// refused there (strconv.Atoi, pflag); now the file's are too (a 32-bit
// platform's test: 64 bits hold them).
func TestConfigFileIntPastThisBuildsIntRefused(t *testing.T) {
	cfg, err := loadWith(t, "inbox_capacity = 4294967396\nmailbox_capacity = 4294967297\n", nil)
	if err != nil {
		return // refused: fine
	}
	if int64(cfg.InboxCapacity) != 4294967396 || int64(cfg.MailboxCapacity) != 4294967297 {
		t.Fatalf("config file said inbox_capacity 4294967396 and mailbox_capacity 4294967297; loaded %d and %d without an error",
			cfg.InboxCapacity, cfg.MailboxCapacity)
	}
}

// For comparison: the same value from the environment is refused on a
// 32-bit int (Atoi's range error), as it should be, and taken on 64 bits.
func TestEnvIntPastThisBuildsIntRefused(t *testing.T) {
	cfg, err := loadWith(t, "", map[string]string{"MESHNODE_INBOX_CAPACITY": "4294967396"})
	if err == nil && int64(cfg.InboxCapacity) != 4294967396 {
		t.Fatalf("env said 4294967396, loaded %d", cfg.InboxCapacity)
	}
}

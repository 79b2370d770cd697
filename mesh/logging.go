package mesh

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// mlLogWriter turns memberlist's log.Logger output into slog records at the
// level memberlist gave each line ([DEBUG], [INFO], [WARN], [ERR]), without
// the level and "memberlist: " prefixes. A line saying gossip could not be
// decrypted becomes a WARN that says what to check, at most once a minute
// per remote address. It also watches for the one line that reveals a local
// suspicion, because memberlist v0.7.0 exposes suspicion through no
// delegate (see doc.go). It never blocks beyond the slog handler and a
// short map write.
type mlLogWriter struct {
	log       *slog.Logger
	onSuspect func(name string)

	// mu guards keyWarned: when each remote address was last reported for
	// a gossip key mismatch.
	mu        sync.Mutex
	keyWarned map[string]time.Time
}

const suspectPrefix = "memberlist: Suspect "
const suspectSuffix = " has failed, no acks received"

// keyWarnEvery bounds the key-mismatch warnings per remote address.
const keyWarnEvery = time.Minute

// keyWarnMax bounds keyWarned; past it the map is reset (a flood of
// addresses must not grow memory).
const keyWarnMax = 1024

// memberlist's words for gossip it could not decrypt or authenticate.
var keyMismatch = []string{
	"no installed keys could decrypt the message",
	"Decrypt packet failed",
	"encryption is configured but remote state is not encrypted",
	"Remote state is encrypted and encryption is not configured",
}

func isKeyMismatch(msg string) bool {
	for _, k := range keyMismatch {
		if strings.Contains(strings.ToLower(msg), strings.ToLower(k)) {
			return true
		}
	}
	return false
}

var levels = []struct {
	prefix string
	level  slog.Level
}{
	{"[DEBUG] ", slog.LevelDebug},
	{"[INFO] ", slog.LevelInfo},
	{"[WARN] ", slog.LevelWarn},
	{"[ERR] ", slog.LevelError},
	{"[ERROR] ", slog.LevelError},
}

func (w *mlLogWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimRight(p, "\n"))
	if i := strings.Index(line, suspectPrefix); i >= 0 && strings.HasSuffix(line, suspectSuffix) &&
		i+len(suspectPrefix) <= len(line)-len(suspectSuffix) {
		name := line[i+len(suspectPrefix) : len(line)-len(suspectSuffix)]
		if w.onSuspect != nil && name != "" {
			w.onSuspect(name)
		}
	}
	level, msg := parseLine(line)
	if isKeyMismatch(msg) {
		w.warnKey(msg)
		return len(p), nil
	}
	if w.log.Enabled(context.Background(), level) {
		w.log.Log(context.Background(), level, msg, "lib", "memberlist")
	}
	return len(p), nil
}

// parseLine splits "[WARN] memberlist: text" into its level and "text";
// a line without a level prefix is debug.
func parseLine(line string) (slog.Level, string) {
	level := slog.LevelDebug
	for _, l := range levels {
		if rest, ok := strings.CutPrefix(line, l.prefix); ok {
			level, line = l.level, rest
			break
		}
	}
	return level, strings.TrimPrefix(line, "memberlist: ")
}

// warnKey reports gossip that could not be decrypted, naming the remote
// address when memberlist gave one ("from=host:port").
func (w *mlLogWriter) warnKey(msg string) {
	from := ""
	for _, tag := range []string{"from=", "failed to join "} {
		if i := strings.Index(msg, tag); i >= 0 {
			if f := strings.Fields(msg[i+len(tag):]); len(f) > 0 {
				from = strings.TrimSuffix(f[0], ":")
				break
			}
		}
	}
	now := time.Now()
	w.mu.Lock()
	if w.keyWarned == nil || len(w.keyWarned) >= keyWarnMax {
		w.keyWarned = map[string]time.Time{}
	}
	last, seen := w.keyWarned[from]
	if seen && now.Sub(last) < keyWarnEvery {
		w.mu.Unlock()
		return
	}
	w.keyWarned[from] = now
	w.mu.Unlock()
	w.log.Warn("gossip with "+orUnknown(from)+" could not be decrypted: check that both nodes use the same gossip key "+
		"(gossip_key_file, from meshnode keygen) and, during a key rotation, that the key is installed on every node",
		"lib", "memberlist", "peer_addr", from, "cause", msg)
}

func orUnknown(s string) string {
	if s == "" {
		return "a peer"
	}
	return s
}

func newMemberlistLogger(l *slog.Logger, onSuspect func(string)) *log.Logger {
	return log.New(&mlLogWriter{log: l, onSuspect: onSuspect}, "", 0)
}

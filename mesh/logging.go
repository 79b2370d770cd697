package mesh

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"strings"
)

// mlLogWriter turns memberlist's log.Logger output into slog debug records.
// It also watches for the one line that reveals a local suspicion, because
// memberlist v0.7.0 exposes suspicion through no delegate (see doc.go).
// It never blocks beyond the slog handler and a short map write.
type mlLogWriter struct {
	log       *slog.Logger
	onSuspect func(name string)
}

const suspectPrefix = "memberlist: Suspect "
const suspectSuffix = " has failed, no acks received"

func (w *mlLogWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimRight(p, "\n"))
	if i := strings.Index(line, suspectPrefix); i >= 0 && strings.HasSuffix(line, suspectSuffix) &&
		i+len(suspectPrefix) <= len(line)-len(suspectSuffix) {
		name := line[i+len(suspectPrefix) : len(line)-len(suspectSuffix)]
		if w.onSuspect != nil && name != "" {
			w.onSuspect(name)
		}
	}
	if w.log.Enabled(context.Background(), slog.LevelDebug) {
		w.log.Debug(line, "component", "memberlist")
	}
	return len(p), nil
}

func newMemberlistLogger(l *slog.Logger, onSuspect func(string)) *log.Logger {
	return log.New(&mlLogWriter{log: l, onSuspect: onSuspect}, "", 0)
}

package main

import (
	"context"
	"io"
	"log/slog"
)

// newLogger returns the daemon's logger and the level variable that SIGHUP
// changes. Records never repeat a key: the layers below each add the node
// name, and a JSON line with two "node" keys is not one that log tools
// read back reliably.
func newLogger(cfg Config, w io.Writer) (*slog.Logger, *slog.LevelVar) {
	level := new(slog.LevelVar)
	level.Set(parseLevel(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(&uniqueKeys{h: h, seen: map[string]bool{}}), level
}

// parseLevel reads a level Validate accepted.
func parseLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// uniqueKeys drops an attribute whose key is already set by an enclosing
// With (the first value wins: it is the outermost, most general one) or
// earlier in the same record. Inside a group keys are the group's own.
type uniqueKeys struct {
	h    slog.Handler
	seen map[string]bool // keys added by With at this level; never mutated after creation
}

func (u *uniqueKeys) Enabled(ctx context.Context, l slog.Level) bool { return u.h.Enabled(ctx, l) }

func (u *uniqueKeys) Handle(ctx context.Context, r slog.Record) error {
	dup := false
	r.Attrs(func(a slog.Attr) bool {
		dup = u.seen[a.Key]
		return !dup
	})
	if !dup && r.NumAttrs() < 2 {
		return u.h.Handle(ctx, r)
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	inRecord := map[string]bool{}
	r.Attrs(func(a slog.Attr) bool {
		if !u.seen[a.Key] && !inRecord[a.Key] {
			inRecord[a.Key] = true
			out.AddAttrs(a)
		}
		return true
	})
	return u.h.Handle(ctx, out)
}

func (u *uniqueKeys) WithAttrs(attrs []slog.Attr) slog.Handler {
	seen := make(map[string]bool, len(u.seen)+len(attrs))
	for k := range u.seen {
		seen[k] = true
	}
	var keep []slog.Attr
	for _, a := range attrs {
		if !seen[a.Key] {
			seen[a.Key] = true
			keep = append(keep, a)
		}
	}
	return &uniqueKeys{h: u.h.WithAttrs(keep), seen: seen}
}

func (u *uniqueKeys) WithGroup(name string) slog.Handler {
	if name == "" {
		return u
	}
	return &uniqueKeys{h: u.h.WithGroup(name), seen: map[string]bool{}}
}

package mesh

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestMemberlistLogLevels(t *testing.T) {
	var buf bytes.Buffer
	l := newMemberlistLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), nil)
	lines := []struct {
		in, level, msg string
	}{
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:1", "DEBUG", "Stream connection from=127.0.0.1:1"},
		{"[INFO] memberlist: Marking n2 as failed, suspect timeout reached (0 peer confirmations)", "INFO", "Marking n2 as failed, suspect timeout reached (0 peer confirmations)"},
		{"[WARN] memberlist: Was able to connect to n2 over TCP but UDP probes failed", "WARN", "Was able to connect to n2 over TCP but UDP probes failed"},
		{"[ERR] memberlist: Failed push/pull merge: boom from=127.0.0.1:2", "ERROR", "Failed push/pull merge: boom from=127.0.0.1:2"},
		{"no prefix at all", "DEBUG", "no prefix at all"},
	}
	for _, tt := range lines {
		buf.Reset()
		l.Println(tt.in)
		var rec map[string]any
		if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
			t.Fatalf("%q: %v (%s)", tt.in, err, buf.String())
		}
		if rec["level"] != tt.level || rec["msg"] != tt.msg || rec["lib"] != "memberlist" {
			t.Errorf("%q logged as %v", tt.in, rec)
		}
	}
}

func TestWrongGossipKeyIsOneWarning(t *testing.T) {
	var buf bytes.Buffer
	l := newMemberlistLogger(slog.New(slog.NewJSONHandler(&buf, nil)), nil)
	line := "[ERR] memberlist: Decrypt packet failed: no installed keys could decrypt the message from=127.0.0.1:7946"
	for range 5 {
		l.Println(line)
	}
	l.Println("[ERR] memberlist: failed to receive: no installed keys could decrypt the message from=127.0.0.2:7946")
	out := strings.TrimSpace(buf.String())
	recs := strings.Split(out, "\n")
	if len(recs) != 2 {
		t.Fatalf("want one warning per remote address, got %d lines:\n%s", len(recs), out)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(recs[0]), &rec); err != nil {
		t.Fatal(err)
	}
	msg, _ := rec["msg"].(string)
	if rec["level"] != "WARN" || rec["peer_addr"] != "127.0.0.1:7946" || !strings.Contains(msg, "gossip_key_file") {
		t.Fatalf("warning %v does not say what to check", rec)
	}
}

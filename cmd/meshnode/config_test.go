package main

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/transport"
	"github.com/spf13/pflag"
)

func loadWith(tb testing.TB, file string, env map[string]string, args ...string) (Config, error) {
	tb.Helper()
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	addFlags(fs)
	if file != "" {
		p := filepath.Join(tb.TempDir(), "meshnode.toml")
		if err := os.WriteFile(p, []byte(file), 0o600); err != nil {
			tb.Fatal(err)
		}
		args = append(args, "--config", p)
	}
	if err := fs.Parse(args); err != nil {
		tb.Fatal(err)
	}
	return LoadConfig(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

func TestConfigPrecedence(t *testing.T) {
	file := `name = "file"
cluster = "filecluster"
data_dir = "/file"
join = ["10.0.0.1:7946"]
mailbox_capacity = 7
inboxes = ["a", "b"]
`
	tests := []struct {
		name  string
		file  string
		env   map[string]string
		args  []string
		check func(Config) string
	}{
		{"defaults", "", nil, nil, func(c Config) string {
			if c.Cluster != "meshnode" || c.AdminAddr != "127.0.0.1:7948" || c.MailboxCapacity != 1024 || c.LogFormat != "text" {
				return "defaults not applied"
			}
			return ""
		}},
		{"file over defaults", file, nil, nil, func(c Config) string {
			if c.Name != "file" || c.Cluster != "filecluster" || c.MailboxCapacity != 7 || len(c.Inboxes) != 2 || c.Join[0] != "10.0.0.1:7946" || c.LogLevel != "info" {
				return "file not applied over defaults"
			}
			return ""
		}},
		{"env over file", file, map[string]string{"MESHNODE_NAME": "env", "MESHNODE_JOIN": "a:1, b:2", "MESHNODE_MAILBOX_CAPACITY": "9"}, nil, func(c Config) string {
			if c.Name != "env" || len(c.Join) != 2 || c.Join[1] != "b:2" || c.MailboxCapacity != 9 || c.Cluster != "filecluster" {
				return "env not applied over file"
			}
			return ""
		}},
		{"flag over env", file, map[string]string{"MESHNODE_NAME": "env", "MESHNODE_DATA_DIR": "/env"}, []string{"--name", "flag", "--join", "x:1", "--join", "y:2", "--mailbox-capacity", "3"}, func(c Config) string {
			if c.Name != "flag" || c.DataDir != "/env" || len(c.Join) != 2 || c.Join[0] != "x:1" || c.MailboxCapacity != 3 {
				return "flag not applied over env"
			}
			return ""
		}},
		{"config file from env", "", map[string]string{"MESHNODE_CONFIG": "/does/not/exist.toml"}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadWith(t, tt.file, tt.env, tt.args...)
			if tt.check == nil {
				if err == nil || !strings.Contains(err.Error(), "does not exist") {
					t.Fatalf("err = %v, want a missing config file error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg := tt.check(c); msg != "" {
				t.Fatalf("%s: %+v", msg, c)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		file string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown key", "name = \"x\"\nnmea = \"typo\"\n", nil, nil, `unknown key "nmea"`},
		{"unknown nested key", "[gossip]\nport = 1\n", nil, nil, `unknown key "gossip`},
		{"bad toml", "name = \n", nil, nil, "config file"},
		{"wrong type", "mailbox_capacity = \"many\"\n", nil, nil, "config file"},
		{"env not a number", "", map[string]string{"MESHNODE_INBOX_CAPACITY": "lots"}, nil, "MESHNODE_INBOX_CAPACITY"},
		{"public admin without token", "", nil, []string{"--admin-addr", "0.0.0.0:7948"}, "admin_token"},
		{"empty host admin without token", "", nil, []string{"--admin-addr", ":7948"}, "not loopback"},
		{"bad log format", "", nil, []string{"--log-format", "xml"}, "log_format"},
		{"bad log level", "", nil, []string{"--log-level", "loud"}, "log_level"},
		{"bad gossip addr", "", nil, []string{"--gossip-addr", "nowhere"}, "gossip_addr"},
		{"bad port", "", nil, []string{"--quic-addr", "1.2.3.4:99999"}, "quic_addr"},
		{"bad join", "", nil, []string{"--join", "nohost"}, "join address"},
		{"zero mailbox", "", nil, []string{"--mailbox-capacity", "0"}, "mailbox_capacity"},
		{"bad inbox name", "", nil, []string{"--inboxes", "a@b"}, "inboxes"},
		{"bad name", "", nil, []string{"--name", "a b"}, "name"},
		{"empty data dir", "", nil, []string{"--data-dir", ""}, "data_dir"},
		{"retention not a duration", "stream_retention = \"a month\"\n", nil, nil, "stream_retention"},
		{"retention in fractional days", "", nil, []string{"--stream-retention", "1.5d"}, "whole number of days"},
		{"margin not a duration", "", map[string]string{"MESHNODE_RETENTION_MARGIN": "soon"}, nil, "retention_margin"},
		{"margin above retention", "", nil, []string{"--stream-retention", "7d", "--retention-margin", "8d"}, "below stream_retention"},
		{"margin equal to retention", "", nil, []string{"--stream-retention", "48h", "--retention-margin", "2d"}, "below stream_retention"},
		{"no margin", "", nil, []string{"--retention-margin", "0s"}, "must be positive"},
		{"frame read timeout not a duration", "frame_read_timeout = \"slow\"\n", nil, nil, "frame_read_timeout"},
		{"no frame read timeout", "", nil, []string{"--frame-read-timeout", "0s"}, "positive duration"},
		{"tiny stream window", "", nil, []string{"--stream-window", "1000"}, "stream_window 1000"},
		{"huge stream window", "stream_window = 1073741824\n", nil, nil, "16 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadWith(t, tt.file, tt.env, tt.args...)
			if !errors.Is(err, errBadConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want bad config mentioning %q", err, tt.want)
			}
		})
	}
	t.Run("token allows a public admin address", func(t *testing.T) {
		if _, err := loadWith(t, "", nil, "--admin-addr", "0.0.0.0:7948", "--admin-token", "t"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestCertFilesDefaultNextToCA(t *testing.T) {
	c := DefaultConfig()
	c.Name, c.CAFile = "n1", filepath.Join("x", "ca.crt")
	cert, key := c.certFiles()
	if cert != filepath.Join("x", "n1.crt") || key != filepath.Join("x", "n1.key") {
		t.Fatalf("cert %s key %s", cert, key)
	}
}

// The retention settings reach the node's outbox, in days or as Go
// durations; the defaults are the outbox's.
func TestRetentionReachesTheOutbox(t *testing.T) {
	def := outbox.DefaultConfig("")
	for _, tc := range []struct {
		args         []string
		keep, margin time.Duration
	}{
		{nil, def.StreamRetention, def.RetentionMargin},
		{[]string{"--stream-retention", "90d", "--retention-margin", "240h"}, 90 * 24 * time.Hour, 10 * 24 * time.Hour},
		{[]string{"--stream-retention", "2h30m", "--retention-margin", "30m"}, 150 * time.Minute, 30 * time.Minute},
	} {
		cfg, err := loadWith(t, "", nil, tc.args...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		keep, margin, err := cfg.retention()
		if err != nil || keep != tc.keep || margin != tc.margin {
			t.Errorf("%v: retention %v, margin %v (%v); want %v and %v", tc.args, keep, margin, err, tc.keep, tc.margin)
		}
	}
	// And into the node's config.
	cfg, err := loadWith(t, "", nil, "--name", "n1", "--ca-file", caWithN1(t), "--stream-retention", "90d", "--retention-margin", "10d")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nodeConfig(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if nc.Outbox.StreamRetention != 90*24*time.Hour || nc.Outbox.RetentionMargin != 10*24*time.Hour {
		t.Errorf("the node's outbox keeps streams %v with a margin of %v; want 90 and 10 days", nc.Outbox.StreamRetention, nc.Outbox.RetentionMargin)
	}
	if c := DefaultConfig(); c.StreamRetention != "30d" || c.RetentionMargin != "7d" {
		t.Errorf("defaults written %q and %q; want 30d and 7d, as the README says", c.StreamRetention, c.RetentionMargin)
	}
}

// caWithN1 writes a CA and node n1's certificate and key into a temporary
// directory and returns the CA's file.
func caWithN1(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ca, err := transport.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := ca.Issue("n1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"ca.crt": ca.CertPEM(), "n1.crt": crt, "n1.key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "ca.crt")
}

// The settings for slow and long links reach the node's transport, from a
// file or flags; the defaults are the transport's.
func TestLinkSettingsReachTheTransport(t *testing.T) {
	def := transport.DefaultConfig("")
	ca := caWithN1(t)
	for _, tc := range []struct {
		file    string
		args    []string
		timeout time.Duration
		window  int
	}{
		{"", nil, def.FrameReadTimeout, def.StreamWindow},
		{"frame_read_timeout = \"2m\"\nstream_window = 4194304\n", nil, 2 * time.Minute, 4 << 20},
		{"", []string{"--frame-read-timeout", "90s", "--stream-window", "65536"}, 90 * time.Second, 64 << 10},
	} {
		cfg, err := loadWith(t, tc.file, nil, append([]string{"--name", "n1", "--ca-file", ca}, tc.args...)...)
		if err != nil {
			t.Fatalf("%q %v: %v", tc.file, tc.args, err)
		}
		nc, err := nodeConfig(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if nc.Transport.FrameReadTimeout != tc.timeout || nc.Transport.StreamWindow != tc.window {
			t.Errorf("%q %v: the transport reads frames within %v with windows of %d; want %v and %d", tc.file, tc.args, nc.Transport.FrameReadTimeout, nc.Transport.StreamWindow, tc.timeout, tc.window)
		}
		if err := nc.Validate(); err != nil {
			t.Errorf("%q %v: the node refuses the config: %v", tc.file, tc.args, err)
		}
	}
}

package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

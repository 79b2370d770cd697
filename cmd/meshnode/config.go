package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/meshnode/meshnode/internal/admin"
	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/transport"
	"github.com/spf13/pflag"
)

// errBadConfig prefixes every configuration error.
var errBadConfig = errors.New("bad config")

// Config is the daemon's configuration: defaults < TOML file < environment
// (MESHNODE_<KEY>) < flags (--<key with dashes>).
type Config struct {
	Name            string   `toml:"name"`             // node name, unique in the cluster and the DNS SAN of its certificate (host name)
	Cluster         string   `toml:"cluster"`          // cluster name; nodes of other clusters are refused ("meshnode")
	DataDir         string   `toml:"data_dir"`         // outbox, inbox, dedupe window, peers ("./meshnode-data")
	GossipAddr      string   `toml:"gossip_addr"`      // memberlist bind address ("0.0.0.0:7946")
	QUICAddr        string   `toml:"quic_addr"`        // QUIC bind address ("0.0.0.0:7947")
	Join            []string `toml:"join"`             // gossip addresses of seed nodes (none)
	GossipKeyFile   string   `toml:"gossip_key_file"`  // base64 32-byte gossip key from `meshnode keygen`; "" = unencrypted gossip
	CAFile          string   `toml:"ca_file"`          // cluster CA certificate ("certs/ca.crt")
	CertFile        string   `toml:"cert_file"`        // this node's certificate; "" = <dir of ca_file>/<name>.crt
	KeyFile         string   `toml:"key_file"`         // this node's key; "" = <dir of ca_file>/<name>.key
	AdminAddr       string   `toml:"admin_addr"`       // admin HTTP API and /metrics; loopback unless admin_token is set ("127.0.0.1:7948")
	AdminToken      string   `toml:"admin_token"`      // bearer token required by the admin API; "" = none
	AdminTLSCert    string   `toml:"admin_tls_cert"`   // certificate the admin API serves HTTPS with; "" = the node's own off loopback, none on it
	AdminTLSKey     string   `toml:"admin_tls_key"`    // its key (with admin_tls_cert)
	LogFormat       string   `toml:"log_format"`       // "text" or "json" ("text")
	LogLevel        string   `toml:"log_level"`        // "debug", "info", "warn" or "error" ("info")
	MailboxCapacity int      `toml:"mailbox_capacity"` // mailbox capacity of each actor (1024)
	Inboxes         []string `toml:"inboxes"`          // inbox actors declared at start (none)
	InboxCapacity   int      `toml:"inbox_capacity"`   // unacknowledged messages per inbox before senders are told to back off (100000)
	Pprof           bool     `toml:"pprof"`            // serve /debug/pprof/ on admin_addr (false)
	// How long a receiver keeps an idle stream's watermark, and how much
	// sooner a sender gives a queued message up ("720h" and "168h"; a
	// whole number of days may be written "30d"). The same on every node.
	StreamRetention string `toml:"stream_retention"`
	RetentionMargin string `toml:"retention_margin"`

	// Links slower or longer than a LAN: how long a frame may take to
	// arrive once it started ("30s"; the largest, 4 MiB, needs about
	// 1.1 Mbit/s for that), and how many bytes a peer may send on one
	// stream ahead of what this node read (524288: one lane moves at most
	// that per round trip).
	FrameReadTimeout string `toml:"frame_read_timeout"`
	StreamWindow     int    `toml:"stream_window"`
}

// DefaultConfig returns the defaults; the name is the host name.
func DefaultConfig() Config {
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "meshnode"
	}
	return Config{
		Name:            name,
		Cluster:         node.DefaultCluster,
		DataDir:         "meshnode-data",
		GossipAddr:      "0.0.0.0:7946",
		QUICAddr:        "0.0.0.0:7947",
		CAFile:          filepath.Join("certs", "ca.crt"),
		AdminAddr:       "127.0.0.1:7948",
		LogFormat:       "text",
		LogLevel:        "info",
		MailboxCapacity: 1024,
		InboxCapacity:   inbox.DefaultConfig("").MaxMessages,
		StreamRetention: days(outbox.DefaultConfig("").StreamRetention),
		RetentionMargin: days(outbox.DefaultConfig("").RetentionMargin),

		FrameReadTimeout: transport.DefaultConfig("").FrameReadTimeout.String(),
		StreamWindow:     transport.DefaultConfig("").StreamWindow,
	}
}

// days writes d as a whole number of days ("30d") when it is one, else as
// Go writes a duration.
func days(d time.Duration) string {
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	}
	return d.String()
}

// parseSpan reads a duration as Go writes one ("720h", "90m") or a whole
// number of days ("30d").
func parseSpan(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if n, ok := strings.CutSuffix(s, "d"); ok {
		v, err := strconv.ParseUint(n, 10, 16)
		if err != nil {
			return 0, fmt.Errorf("%q is not a whole number of days", s)
		}
		return time.Duration(v) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 720h or 30d", s)
	}
	return d, nil
}

// retention returns the stream retention and its margin.
func (c Config) retention() (keep, margin time.Duration, err error) {
	if keep, err = parseSpan(c.StreamRetention); err != nil {
		return 0, 0, fmt.Errorf("stream_retention: %w", err)
	}
	if margin, err = parseSpan(c.RetentionMargin); err != nil {
		return 0, 0, fmt.Errorf("retention_margin: %w", err)
	}
	if margin <= 0 || margin >= keep {
		return 0, 0, fmt.Errorf("retention_margin %s must be positive and below stream_retention %s: senders give a message up that much sooner than receivers forget its stream", c.RetentionMargin, c.StreamRetention)
	}
	return keep, margin, nil
}

// frameReadTimeout returns frame_read_timeout as a duration.
func (c Config) frameReadTimeout() (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(c.FrameReadTimeout))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("frame_read_timeout %q: want a positive duration such as 30s or 2m", c.FrameReadTimeout)
	}
	return d, nil
}

// certFiles returns the certificate and key paths, derived when unset.
func (c Config) certFiles() (cert, key string) {
	cert, key = c.CertFile, c.KeyFile
	dir := filepath.Dir(c.CAFile)
	if cert == "" {
		cert = filepath.Join(dir, c.Name+".crt")
	}
	if key == "" {
		key = filepath.Join(dir, c.Name+".key")
	}
	return cert, key
}

// Validate reports the first problem, naming the setting and what to do.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errBadConfig, fmt.Sprintf(format, args...))
	}
	if strings.ContainsFunc(c.Name, func(r rune) bool { return r == '@' || r == '/' || r <= ' ' || r == 0x7f }) || c.Name == "" || len(c.Name) > 255 {
		return bad("name %q: use letters, digits, '-' or '.' (set --name)", c.Name)
	}
	if c.Cluster == "" {
		return bad("cluster is empty (set --cluster)")
	}
	if c.DataDir == "" {
		return bad("data_dir is empty (set --data-dir)")
	}
	for key, a := range map[string]string{"gossip_addr": c.GossipAddr, "quic_addr": c.QUICAddr, "admin_addr": c.AdminAddr} {
		if _, port, err := net.SplitHostPort(a); err != nil {
			return bad("%s %q is not host:port", key, a)
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return bad("%s %q: port %q is not a number 0-65535", key, a, port)
		}
	}
	for _, j := range c.Join {
		if _, _, err := net.SplitHostPort(j); err != nil {
			return bad("join address %q is not host:port", j)
		}
	}
	// Off loopback the daemon always serves HTTPS (adminTLS), so only the
	// token is the operator's to give.
	if err := admin.CheckAddr(c.AdminAddr, c.AdminToken, true); err != nil {
		return bad("admin_addr %q is not loopback: set admin_token (--admin-token) to expose the admin API, or use 127.0.0.1", c.AdminAddr)
	}
	if (c.AdminTLSCert == "") != (c.AdminTLSKey == "") {
		return bad("admin_tls_cert and admin_tls_key go together: set both or neither")
	}
	if !slices.Contains([]string{"text", "json"}, c.LogFormat) {
		return bad("log_format %q: want text or json", c.LogFormat)
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		return bad("log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.MailboxCapacity <= 0 {
		return bad("mailbox_capacity %d must be positive", c.MailboxCapacity)
	}
	if c.InboxCapacity <= 0 {
		return bad("inbox_capacity %d must be positive", c.InboxCapacity)
	}
	for _, n := range c.Inboxes {
		if err := inbox.ValidName(n); err != nil {
			return bad("inboxes: %v", err)
		}
	}
	if c.CAFile == "" {
		return bad("ca_file is empty (create a CA with `meshnode ca init` and set --ca-file)")
	}
	if _, _, err := c.retention(); err != nil {
		return bad("%v", err)
	}
	if _, err := c.frameReadTimeout(); err != nil {
		return bad("%v", err)
	}
	if lo, hi := transport.MinStreamWindow, transport.MaxStreamWindow; c.StreamWindow < lo || c.StreamWindow > hi {
		return bad("stream_window %d: want bytes from %d (64 KiB) to %d (16 MiB)", c.StreamWindow, lo, hi)
	}
	return nil
}

// setting binds one Config field to its TOML key, flag and env var.
type setting struct {
	key     string // TOML key; the flag is the key with '-' for '_', the env var MESHNODE_<KEY>
	usage   string
	list    bool
	str     func(c *Config) *string   // scalar string fields
	num     func(c *Config) *int      // int fields
	boolean func(c *Config) *bool     // bool fields
	strs    func(c *Config) *[]string // list fields
}

// intsFit refuses a config file whose int setting is past what an int
// holds here: where an int has 32 bits (32-bit ARM boards), the TOML
// decoder keeps the low 32 bits of one without a word (2^32 + 1 places
// would be 1), where the environment and the flags refuse it.
func intsFit(file string) error {
	var raw map[string]any
	if _, err := toml.DecodeFile(file, &raw); err != nil {
		return fmt.Errorf("%w: config file %s: %w", errBadConfig, file, err)
	}
	for _, s := range settings {
		if v, ok := raw[s.key].(int64); ok && s.num != nil && (v > math.MaxInt || v < math.MinInt) {
			return fmt.Errorf("%w: config file %s: %s = %d is past the largest number this build takes (%d)", errBadConfig, file, s.key, v, math.MaxInt)
		}
	}
	return nil
}

func (s setting) flag() string { return strings.ReplaceAll(s.key, "_", "-") }
func (s setting) env() string  { return "MESHNODE_" + strings.ToUpper(s.key) }

var settings = []setting{
	{key: "name", usage: "node name, unique in the cluster; must match its certificate", str: func(c *Config) *string { return &c.Name }},
	{key: "cluster", usage: "cluster name; nodes of other clusters are refused", str: func(c *Config) *string { return &c.Cluster }},
	{key: "data_dir", usage: "directory for the outbox, inbox and peer list", str: func(c *Config) *string { return &c.DataDir }},
	{key: "gossip_addr", usage: "gossip (memberlist) bind address host:port", str: func(c *Config) *string { return &c.GossipAddr }},
	{key: "quic_addr", usage: "QUIC bind address host:port", str: func(c *Config) *string { return &c.QUICAddr }},
	{key: "join", usage: "gossip address of a seed node (repeat or comma-separate)", list: true, strs: func(c *Config) *[]string { return &c.Join }},
	{key: "gossip_key_file", usage: "file with the base64 gossip key, from meshnode keygen (empty: unencrypted)", str: func(c *Config) *string { return &c.GossipKeyFile }},
	{key: "ca_file", usage: "cluster CA certificate, from meshnode ca init", str: func(c *Config) *string { return &c.CAFile }},
	{key: "cert_file", usage: "node certificate (default <dir of ca_file>/<name>.crt)", str: func(c *Config) *string { return &c.CertFile }},
	{key: "key_file", usage: "node private key (default <dir of ca_file>/<name>.key)", str: func(c *Config) *string { return &c.KeyFile }},
	{key: "admin_addr", usage: "admin API and /metrics address; loopback unless admin_token is set", str: func(c *Config) *string { return &c.AdminAddr }},
	{key: "admin_token", usage: "bearer token the admin API requires (needed for a non-loopback admin_addr)", str: func(c *Config) *string { return &c.AdminToken }},
	{key: "admin_tls_cert", usage: "certificate for HTTPS on admin_addr (default off loopback: the node's own; on loopback: plain HTTP)", str: func(c *Config) *string { return &c.AdminTLSCert }},
	{key: "admin_tls_key", usage: "key of admin_tls_cert", str: func(c *Config) *string { return &c.AdminTLSKey }},
	{key: "log_format", usage: "log format: text or json", str: func(c *Config) *string { return &c.LogFormat }},
	{key: "log_level", usage: "log level: debug, info, warn or error", str: func(c *Config) *string { return &c.LogLevel }},
	{key: "mailbox_capacity", usage: "mailbox capacity of each actor", num: func(c *Config) *int { return &c.MailboxCapacity }},
	{key: "inboxes", usage: "inbox actor to declare at start (repeat or comma-separate)", list: true, strs: func(c *Config) *[]string { return &c.Inboxes }},
	{key: "inbox_capacity", usage: "unacknowledged messages per inbox before senders back off", num: func(c *Config) *int { return &c.InboxCapacity }},
	{key: "pprof", usage: "serve Go profiles at /debug/pprof/ on admin_addr", boolean: func(c *Config) *bool { return &c.Pprof }},
	{key: "stream_retention", usage: "how long a receiver keeps an idle stream's watermark (e.g. 720h or 30d; the same on every node)", str: func(c *Config) *string { return &c.StreamRetention }},
	{key: "retention_margin", usage: "how much sooner than stream_retention a sender gives a queued message up (the same on every node)", str: func(c *Config) *string { return &c.RetentionMargin }},
	{key: "frame_read_timeout", usage: "how long a frame may take to arrive once it started (raise it for slow links)", str: func(c *Config) *string { return &c.FrameReadTimeout }},
	{key: "stream_window", usage: "bytes a peer may send on one stream ahead of what this node read (raise it for long, fast links)", num: func(c *Config) *int { return &c.StreamWindow }},
}

// addFlags registers every setting as a flag showing its default and env var.
func addFlags(fs *pflag.FlagSet) {
	def := DefaultConfig()
	for _, s := range settings {
		usage := s.usage + " (env " + s.env() + ")"
		switch {
		case s.list:
			fs.StringSlice(s.flag(), *s.strs(&def), usage)
		case s.num != nil:
			fs.Int(s.flag(), *s.num(&def), usage)
		case s.boolean != nil:
			fs.Bool(s.flag(), *s.boolean(&def), usage)
		default:
			fs.String(s.flag(), *s.str(&def), usage)
		}
	}
	fs.StringP("config", "c", "", "TOML config file (env MESHNODE_CONFIG)")
}

// set parses a string value (from the environment) into the setting.
func (s setting) set(c *Config, v string) error {
	switch {
	case s.list:
		var out []string
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		*s.strs(c) = out
	case s.num != nil:
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%w: %s=%q is not a number", errBadConfig, s.env(), v)
		}
		*s.num(c) = n
	case s.boolean != nil:
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%w: %s=%q is not true or false", errBadConfig, s.env(), v)
		}
		*s.boolean(c) = b
	default:
		*s.str(c) = v
	}
	return nil
}

// LoadConfig builds the configuration: defaults, then the TOML file (from
// --config or MESHNODE_CONFIG), then the environment, then changed flags.
// Unknown TOML keys are an error naming them.
func LoadConfig(fs *pflag.FlagSet, getenv func(string) (string, bool)) (Config, error) {
	cfg := DefaultConfig()
	file, _ := fs.GetString("config")
	if !fs.Changed("config") {
		if v, ok := getenv("MESHNODE_CONFIG"); ok {
			file = v
		}
	}
	if file != "" {
		md, err := toml.DecodeFile(file, &cfg)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return cfg, fmt.Errorf("%w: config file %s does not exist", errBadConfig, file)
			}
			return cfg, fmt.Errorf("%w: config file %s: %w", errBadConfig, file, err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			keys := make([]string, len(und))
			for i, k := range und {
				keys[i] = strconv.Quote(k.String())
			}
			return cfg, fmt.Errorf("%w: config file %s: unknown key %s (known keys: %s)", errBadConfig, file, strings.Join(keys, ", "), knownKeys())
		}
		if err := intsFit(file); err != nil {
			return cfg, err
		}
	}
	for _, s := range settings {
		if v, ok := getenv(s.env()); ok {
			if err := s.set(&cfg, v); err != nil {
				return cfg, err
			}
		}
	}
	for _, s := range settings {
		if !fs.Changed(s.flag()) {
			continue
		}
		switch {
		case s.list:
			v, _ := fs.GetStringSlice(s.flag())
			*s.strs(&cfg) = v
		case s.num != nil:
			v, _ := fs.GetInt(s.flag())
			*s.num(&cfg) = v
		case s.boolean != nil:
			v, _ := fs.GetBool(s.flag())
			*s.boolean(&cfg) = v
		default:
			v, _ := fs.GetString(s.flag())
			*s.str(&cfg) = v
		}
	}
	return cfg, cfg.Validate()
}

func knownKeys() string {
	keys := make([]string, len(settings))
	for i, s := range settings {
		keys[i] = s.key
	}
	return strings.Join(keys, ", ")
}

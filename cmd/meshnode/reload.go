package main

import (
	"log/slog"
	"slices"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/meshnode/meshnode/node"
)

// daemon is what a reload may change; owned by runDaemon's loop.
type daemonState struct {
	cfg   Config
	log   *slog.Logger
	level *slog.LevelVar
	srv   *admin.Server
	node  *node.Node

	adminCert *adminCert // nil: the admin API is plain HTTP
}

// reload re-reads the configuration on SIGHUP and applies what can change
// while running: the log level, the admin token and the node's certificate
// (presented on new connections). The gossip key file is read and checked
// so that a bad rotation is reported now; it takes effect at the next
// restart. A bad configuration is logged and the running one kept.
func (d *daemonState) reload(load func() (Config, error)) {
	if err := sdNotify("RELOADING=1", monotonicUsec()); err != nil {
		d.log.Warn("systemd notification failed", "err", err)
	}
	defer func() {
		if err := sdNotify("READY=1"); err != nil {
			d.log.Warn("systemd notification failed", "err", err)
		}
	}()
	next, err := load()
	if err != nil {
		d.log.Error("reload refused: keeping the running configuration", "err", err)
		return
	}
	var applied, restart []string
	if next.LogLevel != d.cfg.LogLevel {
		d.level.Set(parseLevel(next.LogLevel))
		applied = append(applied, "log_level")
	}
	if next.AdminToken != d.cfg.AdminToken {
		if err := d.srv.SetToken(next.AdminToken); err != nil {
			d.log.Error("reload: admin_token refused: keeping the old one", "err", err)
			next.AdminToken = d.cfg.AdminToken
		} else {
			applied = append(applied, "admin_token")
		}
	}
	if id, err := loadIdentity(next); err != nil {
		d.log.Error("reload: certificate files are not usable: the node keeps its current certificate; fix them", "err", err)
	} else if err := d.node.ReloadCertificate(id); err != nil {
		d.log.Error("reload: certificate refused: the node keeps its current certificate", "err", err)
	} else {
		applied = append(applied, "certificate")
		d.log.Info("reload: certificate presented on new connections", "name", id.Name, "not_after", id.Cert.Leaf.NotAfter.Format(time.RFC3339))
	}
	if d.adminCert != nil {
		if err := d.adminCert.load(); err != nil {
			d.log.Error("reload: admin API certificate not usable: keeping the current one", "err", err)
		} else {
			applied = append(applied, "admin_tls")
		}
	}
	if next.GossipKeyFile != "" {
		if _, err := readGossipKey(next.GossipKeyFile); err != nil {
			d.log.Error("reload: gossip key file is not usable: fix it before the next restart", "err", err)
		}
	}
	for key, changed := range map[string]bool{
		"name": next.Name != d.cfg.Name, "cluster": next.Cluster != d.cfg.Cluster, "data_dir": next.DataDir != d.cfg.DataDir,
		"gossip_addr": next.GossipAddr != d.cfg.GossipAddr, "quic_addr": next.QUICAddr != d.cfg.QUICAddr,
		"admin_addr": next.AdminAddr != d.cfg.AdminAddr, "log_format": next.LogFormat != d.cfg.LogFormat,
		"mailbox_capacity": next.MailboxCapacity != d.cfg.MailboxCapacity, "inbox_capacity": next.InboxCapacity != d.cfg.InboxCapacity,
		"gossip_key_file": next.GossipKeyFile != d.cfg.GossipKeyFile, "pprof": next.Pprof != d.cfg.Pprof,
		"stream_retention": next.StreamRetention != d.cfg.StreamRetention, "retention_margin": next.RetentionMargin != d.cfg.RetentionMargin,
		"frame_read_timeout": next.FrameReadTimeout != d.cfg.FrameReadTimeout, "stream_window": next.StreamWindow != d.cfg.StreamWindow,
	} {
		if changed {
			restart = append(restart, key)
		}
	}
	slices.Sort(restart)
	d.log.Info("reloaded", "applied", applied, "need_restart", restart)
	d.cfg.LogLevel, d.cfg.AdminToken = next.LogLevel, next.AdminToken
}

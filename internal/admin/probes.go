package admin

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/meshnode/meshnode/internal/version"
)

// healthz answers 200 while the process serves HTTP and Config.Live says
// nothing is broken, else 503 with the reason: a liveness probe.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Live != nil {
		if err := s.cfg.Live(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "failed", "reason": err.Error()})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
}

// readyz answers 200 when Config.Ready says so, else 503 with the reason:
// a readiness probe (joined the cluster, stores open, API up).
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "reason": err.Error()})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready"})
}

// version answers the binary's version (internal/version.Info).
func (s *Server) version(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, version.Get())
}

// promLogger passes promhttp's scrape errors to slog.
type promLogger struct{ log *slog.Logger }

func (l promLogger) Println(v ...any) { l.log.Warn("metrics scrape: " + fmt.Sprint(v...)) }

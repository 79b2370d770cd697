package admin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Keyring operations, for rotating the cluster's gossip key without a
// partition: GET /v1/keyring lists every member's keys (as fingerprints);
// POST /v1/keyring {"op": "install"|"use"|"remove", "key": base64} applies
// the operation on every alive member and answers per member.

// KeyringOp is one keyring operation on every alive member; the daemon
// provides it (Config.Keyring). op is "list", "install", "use" or "remove";
// key is nil for "list".
type KeyringOp func(ctx context.Context, op string, key []byte) (map[string]KeyringResult, error)

// KeyringRequest is POST /v1/keyring.
type KeyringRequest struct {
	Op  string `json:"op"`  // install, use or remove
	Key string `json:"key"` // base64 of the 32-byte key
}

// KeyringResult is one member's answer.
type KeyringResult struct {
	Primary string   `json:"primary,omitempty"` // fingerprint of the key gossip is encrypted with
	Keys    []string `json:"keys,omitempty"`    // fingerprints of every installed key
	Error   string   `json:"error,omitempty"`   // why this member did not apply it
}

// KeyringJSON is the answer: results by member name.
type KeyringJSON struct {
	Members map[string]KeyringResult `json:"members"`
}

func (s *Server) keyringList(w http.ResponseWriter, r *http.Request) {
	s.keyringDo(w, r, "list", nil)
}

func (s *Server) keyringChange(w http.ResponseWriter, r *http.Request) {
	var req KeyringRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		s.fail(w, r, fmt.Errorf("%w: keyring request: %w", ErrBadRequest, err))
		return
	}
	switch req.Op {
	case "install", "use", "remove":
	default:
		s.fail(w, r, fmt.Errorf("%w: keyring op %q (want install, use or remove)", ErrBadRequest, req.Op))
		return
	}
	key, err := base64.StdEncoding.DecodeString(req.Key)
	if err != nil || len(key) != 32 {
		s.fail(w, r, fmt.Errorf("%w: the key must be 32 bytes in base64 (as meshnode keygen writes it)", ErrBadRequest))
		return
	}
	s.keyringDo(w, r, req.Op, key)
}

func (s *Server) keyringDo(w http.ResponseWriter, r *http.Request, op string, key []byte) {
	if s.cfg.Keyring == nil {
		s.fail(w, r, errors.New("admin: this daemon has no gossip keyring (gossip is not encrypted)"))
		return
	}
	res, err := s.cfg.Keyring(r.Context(), op, key)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	for _, m := range res {
		if m.Error != "" {
			status = http.StatusMultiStatus // some members did not apply it: the caller must look
		}
	}
	writeJSON(w, status, KeyringJSON{Members: res})
}

package mesh

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/hashicorp/memberlist"
)

// Gossip key rotation. A member decrypts gossip with any installed key and
// encrypts with the primary one, so a cluster changes keys without a
// partition in three steps run on every member: install the new key, use
// it (make it primary), remove the old one. The keyring is persisted in
// DataDir/keyring after each change, so a member that restarts mid-way
// keeps what it was told; SecretKey is always installed too.

// ErrNoEncryption: the mesh runs without a gossip key, so it has no keyring.
var ErrNoEncryption = errors.New("mesh: gossip is not encrypted: no keyring")

// ErrKeyring: a keyring operation was refused (a key of the wrong size,
// removing the primary key, using a key that is not installed).
var ErrKeyring = errors.New("mesh: keyring")

// keyringFile is the persisted keyring: base64 keys, the primary first.
const keyringFile = "keyring"

// KeyringState describes a member's gossip keys without revealing them.
type KeyringState struct {
	Primary string   // fingerprint of the key gossip is encrypted with
	Keys    []string // fingerprints of every installed key, sorted
}

// KeyFingerprint names a key without revealing it: the first 8 bytes of
// its SHA-256, in hex.
func KeyFingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// buildKeyring returns the keyring New gives memberlist: the persisted
// keys (their primary stays primary) plus the configured key.
func buildKeyring(dataDir string, secret []byte) (*memberlist.Keyring, error) {
	keys, err := loadKeyring(dataDir)
	if err != nil {
		return nil, err
	}
	primary := secret
	if len(keys) > 0 {
		primary = keys[0]
	}
	if !slices.ContainsFunc(keys, func(k []byte) bool { return bytes.Equal(k, secret) }) {
		keys = append(keys, secret)
	}
	kr, err := memberlist.NewKeyring(keys, primary)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKeyring, err)
	}
	return kr, nil
}

func loadKeyring(dataDir string) ([][]byte, error) {
	if dataDir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(dataDir, keyringFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrKeyring, keyringFile, err)
	}
	var enc []string
	if err := json.Unmarshal(b, &enc); err != nil {
		return nil, fmt.Errorf("%w: %s is not a list of keys: %w (remove it to use the configured key alone)", ErrKeyring, keyringFile, err)
	}
	keys := make([][]byte, 0, len(enc))
	for _, e := range enc {
		k, err := base64.StdEncoding.DecodeString(e)
		if err != nil || len(k) != 32 {
			return nil, fmt.Errorf("%w: %s holds a key that is not 32 bytes of base64 (remove it to use the configured key alone)", ErrKeyring, keyringFile)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// saveKeyring writes the keyring atomically (temporary file, fsync, rename).
func (m *Mesh) saveKeyring() error {
	if m.cfg.DataDir == "" {
		return nil
	}
	kr := m.keyring
	primary := kr.GetPrimaryKey()
	enc := []string{base64.StdEncoding.EncodeToString(primary)}
	for _, k := range kr.GetKeys() {
		if !bytes.Equal(k, primary) {
			enc = append(enc, base64.StdEncoding.EncodeToString(k))
		}
	}
	b, _ := json.Marshal(enc) // strings only: cannot fail
	path := filepath.Join(m.cfg.DataDir, keyringFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("%w: save: %w", ErrKeyring, err)
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("%w: save: %w", ErrKeyring, err)
	}
	return nil
}

// Keyring returns the member's gossip keys as fingerprints.
func (m *Mesh) Keyring() (KeyringState, error) {
	if m.keyring == nil {
		return KeyringState{}, ErrNoEncryption
	}
	m.keyMu.Lock()
	defer m.keyMu.Unlock()
	st := KeyringState{Primary: KeyFingerprint(m.keyring.GetPrimaryKey())}
	for _, k := range m.keyring.GetKeys() {
		st.Keys = append(st.Keys, KeyFingerprint(k))
	}
	slices.Sort(st.Keys)
	return st, nil
}

// InstallKey adds key to the keyring: gossip encrypted with it is accepted
// from now on. Installing an installed key does nothing.
func (m *Mesh) InstallKey(key []byte) error {
	return m.changeKeyring("install", key, func(kr *memberlist.Keyring) error { return kr.AddKey(key) })
}

// UseKey makes an installed key the primary one: gossip is encrypted with
// it from now on.
func (m *Mesh) UseKey(key []byte) error {
	return m.changeKeyring("use", key, func(kr *memberlist.Keyring) error { return kr.UseKey(key) })
}

// RemoveKey removes a key that is not the primary one.
func (m *Mesh) RemoveKey(key []byte) error {
	return m.changeKeyring("remove", key, func(kr *memberlist.Keyring) error {
		if bytes.Equal(kr.GetPrimaryKey(), key) {
			return errors.New("it is the primary key: use another one first")
		}
		return kr.RemoveKey(key)
	})
}

func (m *Mesh) changeKeyring(op string, key []byte, f func(*memberlist.Keyring) error) error {
	if m.keyring == nil {
		return ErrNoEncryption
	}
	if len(key) != 32 {
		return fmt.Errorf("%w: %s: the key is %d bytes, want 32", ErrKeyring, op, len(key))
	}
	m.keyMu.Lock()
	defer m.keyMu.Unlock()
	if err := f(m.keyring); err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrKeyring, op, KeyFingerprint(key), err)
	}
	m.log.Info("gossip keyring changed", "op", op, "key", KeyFingerprint(key))
	return m.saveKeyring()
}

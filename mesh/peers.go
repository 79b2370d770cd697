package mesh

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
)

// peersFile is the name of the peer list in Config.DataDir.
const peersFile = "peers.json"

// peerRecord is one remembered peer in peers.json.
type peerRecord struct {
	Name string `json:"name"`
	Addr string `json:"addr"` // gossip host:port
}

type peersDoc struct {
	Peers []peerRecord `json:"peers"`
}

// loadPeers reads DataDir/peers.json; a missing file is an empty list.
func loadPeers(dir string) ([]peerRecord, error) {
	if dir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, peersFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: load peers: %w", err)
	}
	return decodePeers(b)
}

// decodePeers parses peers.json; entries with a bad address are an error so a
// corrupt file is noticed rather than half-used.
func decodePeers(b []byte) ([]peerRecord, error) {
	var doc peersDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("mesh: decode peers: %w: %w", ErrBadMessage, err)
	}
	for _, p := range doc.Peers {
		if _, _, err := net.SplitHostPort(p.Addr); err != nil {
			return nil, fmt.Errorf("mesh: decode peers: %w: peer %q addr %q: %w", ErrBadMessage, p.Name, p.Addr, err)
		}
	}
	return doc.Peers, nil
}

// savePeers writes peers.json atomically (temp file, fsync, rename).
func savePeers(dir string, peers []peerRecord) error {
	if dir == "" {
		return nil
	}
	slices.SortFunc(peers, func(a, b peerRecord) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	b, err := json.MarshalIndent(peersDoc{Peers: peers}, "", "  ")
	if err != nil {
		return fmt.Errorf("mesh: save peers: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("mesh: save peers: %w", err)
	}
	f, err := os.CreateTemp(dir, peersFile+".tmp*")
	if err != nil {
		return fmt.Errorf("mesh: save peers: %w", err)
	}
	tmp := f.Name()
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, filepath.Join(dir, peersFile))
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("mesh: save peers: %w", werr)
	}
	return nil
}

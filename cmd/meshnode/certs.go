package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshnode/meshnode/transport"
	"github.com/spf13/cobra"
)

// writeNew writes data to a new file; an existing file is never overwritten.
func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%s already exists: refusing to overwrite it (move it away or choose another directory)", path)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

func newCACmd() *cobra.Command {
	ca := &cobra.Command{Use: "ca", Short: "Manage the cluster certificate authority"}
	var dir, cn string
	var validity time.Duration
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create the cluster CA (ca.crt, and ca.key readable only by you)",
		Long: `Creates a new ECDSA P-256 certificate authority for the cluster. Every node
trusts ca.crt; keep ca.key offline after issuing node certificates. Existing
files are never overwritten.`,
		Example: "  meshnode ca init --dir certs",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return fmt.Errorf("ca init: %w", err)
			}
			c, err := transport.NewCA(cn, validity)
			if err != nil {
				return fmt.Errorf("ca init: %w", err)
			}
			key, err := c.KeyPEM()
			if err != nil {
				return fmt.Errorf("ca init: %w", err)
			}
			crt, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
			for _, p := range []string{crt, keyPath} {
				if _, err := os.Stat(p); err == nil {
					return fmt.Errorf("ca init: %s already exists: refusing to overwrite the cluster CA", p)
				}
			}
			if err := writeNew(keyPath, key, 0o600); err != nil {
				return fmt.Errorf("ca init: %w", err)
			}
			if err := writeNew(crt, c.CertPEM(), 0o644); err != nil {
				return fmt.Errorf("ca init: %w", err)
			}
			return wrote(cmd, crt, keyPath)
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", "certs", "directory for ca.crt and ca.key")
	initCmd.Flags().StringVar(&cn, "common-name", "meshnode cluster CA", "subject common name of the CA")
	initCmd.Flags().DurationVar(&validity, "validity", 10*365*24*time.Hour, "how long the CA is valid")
	addJSONFlag(initCmd)
	ca.AddCommand(initCmd)
	return ca
}

func newCertCmd() *cobra.Command {
	cert := &cobra.Command{Use: "cert", Short: "Manage node certificates"}
	var name, caDir, out string
	var validity time.Duration
	issue := &cobra.Command{
		Use:   "issue",
		Short: "Issue a certificate for a node (NAME.crt and NAME.key)",
		Long: `Issues a certificate signed by the cluster CA whose DNS name is the node
name: a node may only claim the name in its certificate. Writes NAME.crt and
NAME.key (mode 0600) into --out; existing files are never overwritten.`,
		Example: "  meshnode cert issue --name n1 --ca-dir certs --out certs",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return usagef("cert issue: --name is required")
			}
			ca, err := loadCA(caDir)
			if err != nil {
				return fmt.Errorf("cert issue: %w", err)
			}
			c, k, err := ca.Issue(name, validity)
			if err != nil {
				return fmt.Errorf("cert issue: %w", err)
			}
			if out == "" {
				out = caDir
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return fmt.Errorf("cert issue: %w", err)
			}
			crt, key := filepath.Join(out, name+".crt"), filepath.Join(out, name+".key")
			if _, err := os.Stat(crt); err == nil {
				return fmt.Errorf("cert issue: %s already exists: refusing to overwrite it", crt)
			}
			if err := writeNew(key, k, 0o600); err != nil {
				return fmt.Errorf("cert issue: %w", err)
			}
			if err := writeNew(crt, c, 0o644); err != nil {
				return fmt.Errorf("cert issue: %w", err)
			}
			return wrote(cmd, crt, key)
		},
	}
	issue.Flags().StringVar(&name, "name", "", "node name (the certificate's DNS name); required")
	issue.Flags().StringVar(&caDir, "ca-dir", "certs", "directory holding ca.crt and ca.key")
	issue.Flags().StringVar(&out, "out", "", "output directory (default: --ca-dir)")
	issue.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "how long the certificate is valid")
	addJSONFlag(issue)
	cert.AddCommand(issue, newCertRenewCmd())
	return cert
}

func newKeygenCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "Create a gossip encryption key (32 random bytes, base64, mode 0600)",
		Long: `Creates the key that encrypts gossip between nodes. Every node of the cluster
uses the same file (gossip_key_file); a node with another key cannot join.`,
		Example: "  meshnode keygen --out certs/gossip.key",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("keygen: --out is required")
			}
			key := make([]byte, 32)
			if _, err := rand.Read(key); err != nil {
				return fmt.Errorf("keygen: %w", err)
			}
			if err := writeNew(out, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
				return fmt.Errorf("keygen: %w", err)
			}
			return wrote(cmd, out)
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to write; required")
	addJSONFlag(cmd)
	return cmd
}

// readGossipKey reads a keygen file.
func readGossipKey(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("gossip key file %s does not exist (create it with meshnode keygen --out %s)", path, path)
		}
		return nil, fmt.Errorf("gossip key file %s: %w", path, err)
	}
	key, err := base64.StdEncoding.DecodeString(string(trimSpace(data)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("gossip key file %s: want 32 bytes in base64 (create it with meshnode keygen)", path)
	}
	return key, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// wrote reports the files a command wrote, as text or --json.
func wrote(cmd *cobra.Command, files ...string) error {
	if asJSON(cmd) {
		return printJSON(cmd.OutOrStdout(), map[string]any{"wrote": files})
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", strings.Join(files, " and "))
	return nil
}

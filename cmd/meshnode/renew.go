package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/meshnode/meshnode/transport"
	"github.com/spf13/cobra"
)

func newCertRenewCmd() *cobra.Command {
	var name, caDir, out string
	var validity, within time.Duration
	cmd := &cobra.Command{
		Use:   "renew",
		Short: "Replace a node's certificate and key with new ones from the cluster CA",
		Long: `Issues a new certificate and key for the node and replaces NAME.crt and
NAME.key in --out atomically (each is written to a temporary file, synced and
renamed over the old one), so a daemon never reads half a file. With
--within it renews only a certificate that expires within that long, and
otherwise says so and exits 0: run it daily from cron or a systemd timer.

The running daemon loads the new files on SIGHUP (systemctl reload meshnode)
and presents them on new connections from then on.`,
		Example: `  meshnode cert renew --name n1 --ca-dir certs
  meshnode cert renew --name n1 --ca-dir /etc/meshnode/ca --out /etc/meshnode --within 720h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return usagef("cert renew: --name is required")
			}
			if validity <= 0 || within < 0 {
				return usagef("cert renew: --validity must be positive and --within not negative")
			}
			if out == "" {
				out = caDir
			}
			crt, key := filepath.Join(out, name+".crt"), filepath.Join(out, name+".key")
			notAfter, err := certNotAfter(crt)
			if err != nil {
				return fmt.Errorf("cert renew: %w (issue a first one with meshnode cert issue --name %s)", err, name)
			}
			if within > 0 && time.Until(notAfter) > within {
				if asJSON(cmd) {
					return printJSON(cmd.OutOrStdout(), map[string]any{"renewed": false, "not_after": notAfter})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s is valid until %s: not due for renewal (--within %v)\n", crt, notAfter.Format(time.RFC3339), within)
				return nil
			}
			ca, err := loadCA(caDir)
			if err != nil {
				return fmt.Errorf("cert renew: %w", err)
			}
			c, k, err := ca.Issue(name, validity)
			if err != nil {
				return fmt.Errorf("cert renew: %w", err)
			}
			// The key first: a crash in between leaves the old certificate
			// with a new key, which the daemon refuses at start (the pair
			// does not match) instead of running with a mismatch.
			if err := replaceFile(key, k, 0o600); err != nil {
				return fmt.Errorf("cert renew: %w", err)
			}
			if err := replaceFile(crt, c, 0o644); err != nil {
				return fmt.Errorf("cert renew: %w", err)
			}
			next := time.Now().Add(validity)
			if asJSON(cmd) {
				return printJSON(cmd.OutOrStdout(), map[string]any{"renewed": true, "wrote": []string{crt, key}, "not_after": next})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "renewed %s and %s (valid until %s); restart the daemon to present them\n", crt, key, next.Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "node name (the certificate's DNS name); required")
	cmd.Flags().StringVar(&caDir, "ca-dir", "certs", "directory holding ca.crt and ca.key")
	cmd.Flags().StringVar(&out, "out", "", "directory of NAME.crt and NAME.key (default: --ca-dir)")
	cmd.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "how long the new certificate is valid")
	cmd.Flags().DurationVar(&within, "within", 0, "renew only if the certificate expires within this long (0: always)")
	addJSONFlag(cmd)
	return cmd
}

func loadCA(dir string) (*transport.CA, error) {
	crtPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("read CA certificate: %w (create it with meshnode ca init --dir %s)", err, dir)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	return transport.LoadCA(crtPEM, keyPEM)
}

// certNotAfter reads a PEM certificate's expiry.
func certNotAfter(path string) (time.Time, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return time.Time{}, errors.New(path + ": no PEM certificate in it")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", path, err)
	}
	return c.NotAfter, nil
}

// replaceFile writes data next to path, syncs it and renames it over path.
func replaceFile(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if err := tmp.Chmod(perm); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}

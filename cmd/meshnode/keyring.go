package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/node"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// keyringActor is the actor every daemon runs for gossip keyring
// operations asked by another member's operator. It is reached over
// mutual TLS, so only cluster members (holders of a CA-signed certificate)
// can ask it.
const keyringActor = "meshnode.keyring"

// keyringTimeout bounds one member's answer to a keyring operation.
const keyringTimeout = 10 * time.Second

// keyringHandler applies {"op", "key"} to n's keyring and answers with the
// keyring's fingerprints.
func keyringHandler(n *node.Node) node.Handler {
	return func(_ context.Context, m *node.Message) (proto.Message, error) {
		var req structpb.Struct
		if err := m.Decode(&req); err != nil {
			return nil, err
		}
		op := req.GetFields()["op"].GetStringValue()
		var key []byte
		if op != "list" {
			k, err := base64.StdEncoding.DecodeString(req.GetFields()["key"].GetStringValue())
			if err != nil || len(k) != 32 {
				return nil, node.Permanent(errors.New("keyring: the key must be 32 bytes in base64"))
			}
			key = k
		}
		var err error
		switch op {
		case "list":
		case "install":
			err = n.InstallGossipKey(key)
		case "use":
			err = n.UseGossipKey(key)
		case "remove":
			err = n.RemoveGossipKey(key)
		default:
			return nil, node.Permanent(fmt.Errorf("keyring: unknown op %q", op))
		}
		if err != nil {
			return nil, node.Permanent(err)
		}
		st, err := n.GossipKeyring()
		if err != nil {
			return nil, node.Permanent(err)
		}
		keys := make([]any, len(st.Keys))
		for i, k := range st.Keys {
			keys[i] = k
		}
		return structpb.NewStruct(map[string]any{"primary": st.Primary, "keys": keys})
	}
}

// keyringFanOut returns the admin API's keyring operation: it asks every
// alive member's keyring actor, this node's included, at once.
func keyringFanOut(n *node.Node) admin.KeyringOp {
	return func(ctx context.Context, op string, key []byte) (map[string]admin.KeyringResult, error) {
		req := map[string]any{"op": op}
		if key != nil {
			req["key"] = base64.StdEncoding.EncodeToString(key)
		}
		msg, err := structpb.NewStruct(req)
		if err != nil {
			return nil, err
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		out := map[string]admin.KeyringResult{}
		for _, m := range n.Members() {
			if m.State != mesh.StateAlive && m.State != mesh.StateSuspect {
				continue
			}
			wg.Go(func() {
				actx, cancel := context.WithTimeout(ctx, keyringTimeout)
				defer cancel()
				var reply structpb.Struct
				var res admin.KeyringResult
				if err := n.Ask(actx, node.Addr(keyringActor, m.Name), msg, &reply); err != nil {
					res.Error = err.Error()
				} else {
					res.Primary = reply.GetFields()["primary"].GetStringValue()
					for _, k := range reply.GetFields()["keys"].GetListValue().GetValues() {
						res.Keys = append(res.Keys, k.GetStringValue())
					}
				}
				mu.Lock()
				out[m.Name] = res
				mu.Unlock()
			})
		}
		wg.Wait()
		return out, nil
	}
}

func newKeyringCmd() *cobra.Command {
	kr := &cobra.Command{
		Use:   "keyring",
		Short: "List or rotate the cluster's gossip keys on every member",
		Long: `Rotates the gossip key of a running cluster without a partition: install
the new key on every member, then use it (every member encrypts with it),
then remove the old one. Each step is applied by every alive member; a member
that was down misses it and must be given it (or the new gossip_key_file)
before it rejoins. Keys are given as the base64 a keygen file holds
(--key-file) and are shown as fingerprints. After the rotation, point
gossip_key_file at the new key.`,
		Example: `  meshnode keygen --out certs/gossip-2.key
  meshnode keyring install --key-file certs/gossip-2.key
  meshnode keyring use --key-file certs/gossip-2.key
  meshnode keyring remove --key-file certs/gossip.key
  meshnode keyring list`,
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "Show every member's gossip keys (fingerprints)",
		Example: `  meshnode keyring list
  meshnode keyring list --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runKeyring(cmd, "list", "") },
	}
	addClientFlags(list)
	kr.AddCommand(list)
	for _, op := range []struct{ name, short, example string }{
		{"install", "Install a key on every member (gossip encrypted with it is accepted)", "  meshnode keyring install --key-file certs/gossip-2.key"},
		{"use", "Make an installed key the one every member encrypts with", "  meshnode keyring use --key-file certs/gossip-2.key"},
		{"remove", "Remove a key (not the one in use) from every member", "  meshnode keyring remove --key-file certs/gossip.key"},
	} {
		var keyFile string
		c := &cobra.Command{
			Use:     op.name + " --key-file FILE",
			Short:   op.short,
			Example: op.example,
			Args:    cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if keyFile == "" {
					return usagef("keyring %s: --key-file is required", op.name)
				}
				return runKeyring(cmd, op.name, keyFile)
			},
		}
		c.Flags().StringVar(&keyFile, "key-file", "", "file with the key in base64 (from meshnode keygen)")
		addClientFlags(c)
		kr.AddCommand(c)
	}
	return kr
}

func runKeyring(cmd *cobra.Command, op, keyFile string) error {
	c, err := newClient(cmd)
	if err != nil {
		return err
	}
	var out admin.KeyringJSON
	if op == "list" {
		err = c.do(cmd.Context(), http.MethodGet, "/v1/keyring", nil, &out, keyringTimeout)
	} else {
		key, kerr := readGossipKey(keyFile)
		if kerr != nil {
			return usagef("keyring %s: %w", op, kerr)
		}
		req := admin.KeyringRequest{Op: op, Key: base64.StdEncoding.EncodeToString(key)}
		err = c.do(cmd.Context(), http.MethodPost, "/v1/keyring", req, &out, keyringTimeout)
	}
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	if asJSON(cmd) {
		if err := printJSON(w, out); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MEMBER\tPRIMARY\tKEYS\tERROR")
		for _, name := range slices.Sorted(func(yield func(string) bool) {
			for n := range out.Members {
				if !yield(n) {
					return
				}
			}
		}) {
			r := out.Members[name]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, r.Primary, strings.Join(r.Keys, ","), r.Error)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	var failed []string
	for name, r := range out.Members {
		if r.Error != "" {
			failed = append(failed, name)
		}
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		return withCode(exitFailure, fmt.Errorf("keyring %s: not applied on %s; repeat it once they are up", op, strings.Join(failed, ", ")))
	}
	return nil
}

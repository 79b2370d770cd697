package main

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/meshnode/meshnode/internal/storecheck"
	"github.com/spf13/cobra"
	bolt "go.etcd.io/bbolt"
)

// store is one bbolt file of a data directory and where its identity lives.
type storeFile struct {
	name          string // file name in the data directory
	bucket, idKey string // the identity inside the file
}

var storeFiles = []storeFile{
	{"outbox.db", "meta", "outbox_id"},
	{"inbox.db", "meta", "store_id"},
}

// DoctorResult is one store's finding, as --json prints it.
type DoctorResult struct {
	File     string   `json:"file"`
	State    string   `json:"state"` // ok, new, damaged, lost, salvaged, forgotten, busy
	Pages    int64    `json:"pages,omitempty"`
	Keys     int64    `json:"keys,omitempty"`
	Problems []string `json:"problems,omitempty"`
	Kept     string   `json:"kept,omitempty"` // salvaged: where the damaged file is now
	Copied   int64    `json:"copied,omitempty"`
	Note     string   `json:"note,omitempty"`
}

func newDoctorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check a stopped node's stores; salvage a damaged one, or accept a lost one",
		Long: `Checks outbox.db and inbox.db in a data directory page by page, as the
daemon does before it opens them, and the key order besides. Run it with the
node stopped.

A damaged store (the daemon refuses to start on it) is repaired with
--salvage: every readable bucket, key and value is copied into a new file,
which takes the store's place; the damaged file is kept beside it as
<file>.damaged-<time>. What sat in unreadable pages is lost: queued
messages there are gone (their senders' tools, not this node, know them).

A lost store (the file is missing or empty, but the data directory had one)
is either restored from a backup by the operator or accepted as gone with
--forget, after which the node starts with an empty one.

Exits 0 when every store is healthy (or was repaired), 1 when one is
damaged or lost and was left as it is.`,
		Example: `  meshnode doctor --data-dir /var/lib/meshnode
  meshnode doctor --data-dir /var/lib/meshnode --salvage
  meshnode doctor --data-dir /var/lib/meshnode --forget`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, _ := cmd.Flags().GetString("data-dir")
			salvage, _ := cmd.Flags().GetBool("salvage")
			forget, _ := cmd.Flags().GetBool("forget")
			var results []DoctorResult
			bad := 0
			for _, sf := range storeFiles {
				r := doctor(filepath.Join(dir, sf.name), sf, salvage, forget)
				if r.State == "damaged" || r.State == "lost" || r.State == "busy" {
					bad++
				}
				results = append(results, r)
			}
			if asJSON(cmd) {
				if err := printJSON(cmd.OutOrStdout(), results); err != nil {
					return err
				}
			} else {
				printDoctor(cmd.OutOrStdout(), results)
			}
			if bad > 0 {
				return withCode(exitFailure, fmt.Errorf("%d store(s) in %s need attention (see above)", bad, dir))
			}
			return nil
		},
	}
	def := DefaultConfig().DataDir
	if v, ok := os.LookupEnv("MESHNODE_DATA_DIR"); ok {
		def = v
	}
	cmd.Flags().String("data-dir", def, "the node's data directory (env MESHNODE_DATA_DIR)")
	cmd.Flags().Bool("salvage", false, "copy what is readable of a damaged store into a new file that takes its place")
	cmd.Flags().Bool("forget", false, "accept that a lost store is gone: the node starts with an empty one")
	addJSONFlag(cmd)
	return cmd
}

// doctor checks one store file and, when asked, repairs it.
func doctor(path string, sf storeFile, salvage, forget bool) DoctorResult {
	r := DoctorResult{File: path}
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && st.Size() == 0) {
		if _, ierr := os.Stat(storecheck.IDPath(path)); ierr != nil {
			r.State, r.Note = "new", "no store yet: the node creates it"
			return r
		}
		if !forget {
			r.State, r.Note = "lost", "the file is missing or empty but this directory had a store: restore it from a backup, or run with --forget to start empty"
			return r
		}
		if err := storecheck.Forget(path); err != nil {
			r.State, r.Note = "lost", err.Error()
			return r
		}
		r.State, r.Note = "forgotten", "the node starts with an empty store"
		return r
	}
	rep, err := storecheck.Check(path)
	r.Pages, r.Keys, r.Problems = rep.Pages, rep.Keys, rep.Problems
	if rep.More > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("... and %d more", rep.More))
	}
	switch {
	case err == nil:
		r.State = "ok"
		if _, herr := storecheck.ReadHigh(path); herr != nil {
			// The store refuses to open on it.
			r.State, r.Note = "damaged", herr.Error()
		}
		return r
	case !errors.Is(err, storecheck.ErrDamaged):
		r.State, r.Note = "busy", err.Error()+" (stop the node first)"
		return r
	case !salvage:
		r.State, r.Note = "damaged", "the node refuses it: run with --salvage to copy what is readable into a new file"
		return r
	}
	return salvageStore(path, sf, r)
}

// salvageStore copies what is readable into a new file and swaps it in.
func salvageStore(path string, sf storeFile, r DoctorResult) DoctorResult {
	tmp := path + ".salvaged"
	_ = os.Remove(tmp) // a leftover of an interrupted salvage
	srep, err := storecheck.Salvage(path, tmp)
	if err != nil {
		r.State, r.Note = "damaged", err.Error()
		return r
	}
	r.Kept = fmt.Sprintf("%s.damaged-%s", path, time.Now().UTC().Format("20060102T150405Z"))
	if err := os.Rename(path, r.Kept); err != nil {
		r.State, r.Note = "damaged", err.Error()
		return r
	}
	if err := os.Rename(tmp, path); err != nil {
		r.State, r.Note = "damaged", fmt.Sprintf("the salvaged copy is %s: %v", tmp, err)
		return r
	}
	r.State, r.Copied = "salvaged", srep.Keys
	// The copy keeps the store's identity when its page was readable; if
	// not, the node makes a new one, and the recorded one must go.
	id, err := readIdentity(path, sf)
	switch {
	case err != nil:
		r.Note = err.Error()
	case id == nil:
		_ = storecheck.Forget(path)
		r.Note = "the store's identity was unreadable: the node starts it anew (receivers see new streams)"
	default:
		_ = os.Remove(storecheck.CleanPath(path))
		r.Note = "identity " + hex.EncodeToString(id) + " kept"
	}
	return r
}

func readIdentity(path string, sf storeFile) ([]byte, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open the salvaged copy: %w", err)
	}
	defer func() { _ = db.Close() }()
	var id []byte
	_ = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte(sf.bucket)); b != nil {
			if v := b.Get([]byte(sf.idKey)); len(v) == 16 {
				id = append([]byte(nil), v...)
			}
		}
		return nil
	})
	return id, nil
}

func printDoctor(w io.Writer, results []DoctorResult) {
	for _, r := range results {
		fmt.Fprintf(w, "%s: %s", r.File, r.State)
		if r.State == "ok" || r.State == "salvaged" {
			fmt.Fprintf(w, " (%d pages, %d keys", r.Pages, r.Keys)
			if r.State == "salvaged" {
				fmt.Fprintf(w, "; %d keys copied, the damaged file is %s", r.Copied, r.Kept)
			}
			fmt.Fprint(w, ")")
		}
		fmt.Fprintln(w)
		for _, p := range r.Problems {
			fmt.Fprintln(w, "  problem:", p)
		}
		if r.Note != "" {
			fmt.Fprintln(w, "  "+r.Note)
		}
	}
}

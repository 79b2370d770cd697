package testutil

import (
	"testing"

	bolt "go.etcd.io/bbolt"
)

// LeafFill opens the closed bbolt file at path read-only and returns how
// full the leaf pages of the bucket at bucketPath are: the bytes in use
// over the bytes allocated to them.
func LeafFill(tb testing.TB, path string, bucketPath ...string) float64 {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		tb.Fatalf("open %s: %v", path, err)
	}
	defer func() { _ = db.Close() }()
	var st bolt.BucketStats
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucketPath[0]))
		for _, name := range bucketPath[1:] {
			if b != nil {
				b = b.Bucket([]byte(name))
			}
		}
		if b == nil {
			tb.Fatalf("%s: no bucket %q", path, bucketPath)
		}
		st = b.Stats()
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	if st.LeafAlloc == 0 {
		tb.Fatalf("%s: bucket %q has no leaf pages of its own", path, bucketPath)
	}
	return float64(st.LeafInuse) / float64(st.LeafAlloc)
}

package mailbox_test

import (
	"sync"
	"testing"

	"github.com/meshnode/meshnode/mailbox"
)

func TestNewIDUnique(t *testing.T) {
	const goroutines, per = 8, 5000
	var mu sync.Mutex
	seen := make(map[string]bool, goroutines*per)
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]string, per)
			for i := range local {
				local[i] = mailbox.NewID()
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range local {
				if seen[id] {
					t.Errorf("duplicate id %q", id)
				}
				seen[id] = true
			}
		}()
	}
	wg.Wait()
	id := mailbox.NewID()
	if len(id) != 22 {
		t.Fatalf("len(%q) = %d, want 22", id, len(id))
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			t.Fatalf("id %q has non-URL-safe rune %q", id, c)
		}
	}
}

func TestDeterministicID(t *testing.T) {
	tests := []struct {
		name  string
		a, b  [][]byte
		equal bool
	}{
		{"same parts", [][]byte{[]byte("a"), []byte("b")}, [][]byte{[]byte("a"), []byte("b")}, true},
		{"boundary moves", [][]byte{[]byte("ab"), []byte("c")}, [][]byte{[]byte("a"), []byte("bc")}, false},
		{"empty part counts", [][]byte{[]byte("a")}, [][]byte{[]byte("a"), nil}, false},
		{"order matters", [][]byte{[]byte("a"), []byte("b")}, [][]byte{[]byte("b"), []byte("a")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x, y := mailbox.DeterministicID(tt.a...), mailbox.DeterministicID(tt.b...)
			if len(x) != 32 || len(y) != 32 {
				t.Fatalf("lengths %d, %d, want 32", len(x), len(y))
			}
			if (x == y) != tt.equal {
				t.Fatalf("%q vs %q: equal=%v, want %v", x, y, x == y, tt.equal)
			}
		})
	}
	// Golden value (computed independently): keys are persisted, so the
	// encoding must never change between releases.
	if got, want := mailbox.DeterministicID([]byte("a@n1"), []byte("b@n2"), []byte("body")), "4b477badc2da63594392502b41748916"; got != want {
		t.Fatalf("DeterministicID = %q, want %q", got, want)
	}
}

func TestIdempotencyKeyFor(t *testing.T) {
	k1 := mailbox.IdempotencyKeyFor("a@n1", "b@n2", []byte("body"))
	if k1 != mailbox.IdempotencyKeyFor("a@n1", "b@n2", []byte("body")) {
		t.Fatal("key not stable")
	}
	if k1 != mailbox.DeterministicID([]byte("a@n1"), []byte("b@n2"), []byte("body")) {
		t.Fatal("key is not DeterministicID of its parts")
	}
	for _, other := range []string{
		mailbox.IdempotencyKeyFor("a@n1", "b@n3", []byte("body")),
		mailbox.IdempotencyKeyFor("a@n2", "b@n2", []byte("body")),
		mailbox.IdempotencyKeyFor("a@n1", "b@n2", []byte("bodz")),
	} {
		if other == k1 {
			t.Fatal("different inputs gave the same key")
		}
	}
}

// TestNewIDUnpredictable: an Ask's correlation id is its message id, so a
// member that has seen some of a node's ids must not be able to derive the
// next ones. Consecutive ids share no more than chance would give (a
// counter, however it is encoded, shares its leading digits).
func TestNewIDUnpredictable(t *testing.T) {
	const n = 2000
	prev := mailbox.NewID()
	common := 0
	for i := 0; i < n; i++ {
		id := mailbox.NewID()
		for j := 0; j < len(id) && id[j] == prev[j]; j++ {
			common++
		}
		prev = id
	}
	// Random base64 digits match with p = 1/64: about n/63 leading digits
	// in common over n pairs; a counter shares ~11 per pair.
	if common > n/8 {
		t.Fatalf("consecutive ids share %d leading digits over %d pairs: predictable", common, n)
	}
}

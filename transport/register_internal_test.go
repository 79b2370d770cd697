package transport

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
)

// registerCase is one decision of register: the connection a node holds
// (old) and a new one (c), by who dialed each and what the peer's Hello on
// c said it no longer has.
type registerCase struct {
	name       string
	self, peer string
	oldDialed  bool   // this node dialed old
	newDialed  bool   // this node dialed c
	gone       uint64 // the peer's Hello on c
	wantKept   string // "old" or "new"
	wantCode   uint64
}

const oldID, newID, olderID = 0x1111, 0x2222, 0x0999

// A connection the peer's Hello names as gone gives way to the new one
// whoever dialed it; one it does not name is judged as before: by the
// simultaneous-dial tie-break (the smaller name's dial stays) or as the
// same side dialing twice.
func TestRegisterGoneConnection(t *testing.T) {
	for _, tc := range []registerCase{
		// The partition case: a dialed old, b closed it (its close was
		// lost) and dials again.
		{"the peer dials after closing a connection the smaller name dialed", "a", "b", true, false, oldID, "new", uint64(CodeReplaced)},
		{"the same without the peer's word: the tie-break keeps it", "a", "b", true, false, 0, "old", uint64(CodeDuplicate)},
		{"an older connection named: the tie-break keeps it", "a", "b", true, false, olderID, "old", uint64(CodeDuplicate)},
		{"the new connection's own id named: the tie-break keeps it", "a", "b", true, false, newID, "old", uint64(CodeDuplicate)},
		// Seen from b, when it dials (Redial) over a connection a dialed
		// and closed: a's answering Hello names it.
		{"the acceptor's Hello names the connection the dialer holds", "b", "a", false, true, oldID, "new", uint64(CodeReplaced)},
		{"the same without the acceptor's word: the tie-break keeps it", "b", "a", false, true, 0, "old", uint64(CodeDuplicate)},
		// The tie-break's other outcome, and the same dialer twice, are
		// unchanged by a Hello naming another connection.
		{"the smaller name's new dial wins the tie-break", "a", "b", false, true, olderID, "new", uint64(CodeDuplicate)},
		{"the same side dials twice", "a", "b", false, false, olderID, "new", uint64(CodeReplaced)},
	} {
		t.Run(tc.name, func(t *testing.T) { checkRegister(t, tc) })
	}
}

func checkRegister(t *testing.T, tc registerCase) {
	t.Helper()
	tr := &Transport{cfg: Config{NodeName: tc.self}, peers: map[string]*peer{}}
	info := PeerInfo{Name: tc.peer, BootID: "boot-1"}
	old := &conn{t: tr, peer: info, dialed: tc.oldDialed, id: oldID}
	c := &conn{t: tr, peer: info, dialed: tc.newDialed, id: newID, peerGone: tc.gone}
	if loser, _, _ := tr.register(old); loser != nil {
		t.Fatalf("first connection lost to nothing: %v", loser)
	}
	loser, code, reason := tr.register(c)
	want, wantLoser := old, c
	if tc.wantKept == "new" {
		want, wantLoser = c, old
	}
	if kept := tr.peers[tc.peer].conn; kept != want || loser != wantLoser {
		t.Fatalf("kept the %s connection, want the %s one (reason %q)", nameOf(kept, old), tc.wantKept, reason)
	}
	if uint64(code) != tc.wantCode {
		t.Fatalf("close code %d (%q), want %d", code, reason, tc.wantCode)
	}
	wantGone := uint64(0)
	if want == c {
		wantGone = oldID
	}
	if got := tr.goneFor(tc.peer); got != wantGone {
		t.Fatalf("the next Hello to %s names %#x as gone, want %#x", tc.peer, got, wantGone)
	}
}

func nameOf(kept, old *conn) string {
	if kept == old {
		return "old"
	}
	return "new"
}

// Whatever takes a registered connection out of the peer table makes it
// the one the next Hello names: a replaced one above, and here one that
// ends (unregister, on shutdown). One that never was registered, or a
// second ending, changes nothing.
func TestGoneFollowsTheRegisteredConnection(t *testing.T) {
	tr := &Transport{cfg: Config{NodeName: "a"}, peers: map[string]*peer{}}
	info := PeerInfo{Name: "b", BootID: "boot-1"}
	x := &conn{t: tr, peer: info, dialed: true, id: oldID}
	y := &conn{t: tr, peer: info, dialed: false, id: newID}
	if got := tr.goneFor("b"); got != 0 {
		t.Fatalf("gone %#x before any connection, want 0", got)
	}
	tr.register(x)
	if loser, _, _ := tr.register(y); loser != y {
		t.Fatalf("test bug: the tie-break kept %p, want x", loser)
	}
	if got := tr.goneFor("b"); got != 0 {
		t.Fatalf("gone %#x after a connection lost the tie-break before registering, want 0", got)
	}
	tr.unregister(y)
	if got := tr.goneFor("b"); got != 0 {
		t.Fatalf("gone %#x after an unregistered connection ended, want 0", got)
	}
	tr.unregister(x)
	if got := tr.goneFor("b"); got != oldID {
		t.Fatalf("gone %#x after the registered connection ended, want %#x", got, uint64(oldID))
	}
	tr.unregister(x)
	if got := tr.goneFor("b"); got != oldID {
		t.Fatalf("gone %#x after a second unregister, want %#x", got, uint64(oldID))
	}
}

// A dial that gave way to the peer's and waited in vain says what
// happened and what to check, not only that the peer is unreachable.
func TestAwaitConnSaysWhatToCheck(t *testing.T) {
	tr := &Transport{cfg: Config{NodeName: "a", HandshakeTimeout: time.Millisecond}, peers: map[string]*peer{}, ctx: context.Background()}
	err := tr.awaitConn(&peer{name: "b"})
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("awaitConn = %v, want ErrUnreachable", err)
	}
	for _, want := range []string{"gave way to b's", "handshake timeout (1ms)", "the next send dials again", "check that b can reach this node's address"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("awaitConn's error %q does not say %q", err, want)
		}
	}
}

// A departed peer's entry is kept while the peer may still hold the last
// connection (until it idles out there), so that a Hello after it comes
// back still names that connection as gone; then it is forgotten.
func TestForgetPeerKeepsTheGoneConnectionUntilItIdlesOut(t *testing.T) {
	tr := &Transport{cfg: Config{NodeName: "a", MaxIdleTimeout: time.Hour}, peers: map[string]*peer{}}
	x := &conn{t: tr, peer: PeerInfo{Name: "b", BootID: "boot-1"}, dialed: true, id: oldID}
	tr.register(x)
	tr.unregister(x)
	if tr.ForgetPeer("b") {
		t.Fatal("forgot b while it may still hold the connection that left an instant ago")
	}
	if got := tr.goneFor("b"); got != oldID {
		t.Fatalf("the next Hello to b names %#x as gone, want %#x", got, uint64(oldID))
	}
	tr.mu.Lock()
	tr.peers["b"].goneAt = time.Now().Add(-time.Hour)
	tr.mu.Unlock()
	if !tr.ForgetPeer("b") {
		t.Fatal("kept b past MaxIdleTimeout after its last connection left")
	}
	if got := tr.goneFor("b"); got != 0 {
		t.Fatalf("gone %#x after b was forgotten, want 0", got)
	}
}

// A caller that waited for the peer's connection in vain no longer holds
// the entry: once the last connection idled out, a departed peer is
// forgotten (the node's pruning would otherwise retry it forever).
func TestForgetPeerAfterAWaitForTheConnectionGaveUp(t *testing.T) {
	tr := &Transport{cfg: Config{NodeName: "a", HandshakeTimeout: time.Millisecond, MaxIdleTimeout: time.Hour},
		peers: map[string]*peer{}, ctx: context.Background()}
	tr.mu.Lock()
	p := tr.peerLocked("b")
	tr.mu.Unlock()
	if err := tr.awaitConn(p); err == nil {
		t.Fatal("awaitConn without a connection = nil")
	}
	if !tr.ForgetPeer("b") {
		t.Fatal("kept b after the only caller waiting for its connection gave up")
	}
}

// A dial waiting for the peer's connection that this node was setting up
// goes on at once when that setup fails, instead of after HandshakeTimeout.
func TestAwaitAcceptedEndsWhenTheSetupFails(t *testing.T) {
	tr := &Transport{cfg: Config{NodeName: "a", HandshakeTimeout: time.Hour}, peers: map[string]*peer{}, ctx: context.Background()}
	tr.mu.Lock()
	p := tr.peerLocked("b")
	p.accepting = 1
	tr.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- tr.awaitAccepted(p) }()
	testutil.WaitFor(t, 5*time.Second, "a caller waiting", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return p.awaiting == 1 && p.registered != nil
	})
	tr.admitted("b") // its setup failed: never registered
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("awaitAccepted = %v, want ErrUnreachable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("awaitAccepted still waits after the setup it waited for failed")
	}
}

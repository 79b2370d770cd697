package node

import (
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// A refusal racing with the lapse of the window leaves both the window and
// the room in bytes kept for the refused message: after expectBack
// returns, while the window it set runs, the room covers the message.
func TestRefusalRacingTheLapseKeepsItsBytes(t *testing.T) {
	s, err := outbox.Open(outbox.DefaultConfig(filepath.Join(t.TempDir(), "outbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := &actor{n: &Node{store: s}}
	big := &delivery{Message: Message{env: &pb.Envelope{MsgId: "big", Body: nil, Type: string(make([]byte, 10000))}}}
	size := deliverySize(big)
	lost := 0
	const rounds = 20000
	for range rounds {
		// A window that lapsed, with the size of the one it was kept for.
		a.waiting.Store(&roomWait{untilMs: 1, bytes: 100, bytesUntilMs: 1})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); runtime.Gosched(); a.keepsRoom() }()
		go func() { defer wg.Done(); a.expectBack(big, 0) }()
		wg.Wait()
		if keep, keepBytes := a.keepsRoom(); !keep || keepBytes < size {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d refusals racing with the lapse left the room kept below the refused message's %d bytes", lost, rounds, size)
	}
}

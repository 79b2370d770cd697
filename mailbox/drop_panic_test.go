package mailbox_test

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox"
)

// An OnDrop that panics for one item does not cost the other items the
// same call drops their OnDrop: a Post that evicts several under
// DropOldest, and Close, hand every item over, and the panic still
// reaches their caller (the last of two, as Go's deferred calls give it).
func TestPanickingOnDropStillDropsTheRest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		drop   func(m *mailbox.Mailbox[int]) error
		reason mailbox.DropReason
		want   []int
	}{
		{"post evicting three", func(m *mailbox.Mailbox[int]) error { return m.Post(30) }, mailbox.DroppedOldest, []int{2, 3, 4}},
		{"close", func(m *mailbox.Mailbox[int]) error { m.Close(); return nil }, mailbox.DroppedClosed, []int{2, 3, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			started, free := make(chan struct{}), make(chan struct{})
			var dropped []int // OnDrop runs on this goroutine (Post, Close)
			m, err := mailbox.New(mailbox.Config[int]{
				Capacity: 8,
				MaxBytes: 30,
				Size:     func(i int) int64 { return int64(i) },
				Overflow: mailbox.DropOldest,
				Handle: func(i int) {
					if i == 1 {
						close(started)
						<-free
					}
				},
				OnDrop: func(i int, r mailbox.DropReason) {
					dropped = append(dropped, i)
					if i == 2 || i == 3 {
						panic(fmt.Sprintf("drop hook failed on %d (%v)", i, r))
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, i := range []int{1, 2, 3, 4} {
				if err := m.Post(i); err != nil {
					t.Fatal(err)
				}
				if i == 1 {
					<-started // 1 is being handled: 2, 3 and 4 are queued
				}
			}
			if tc.name == "close" {
				// Close takes 2, 3 and 4 at once, then waits for the
				// running Handle: free it only once they are taken, or it
				// would handle them first.
				go func() {
					for deadline := time.Now().Add(10 * time.Second); m.Stats().DroppedClosed < 3 && time.Now().Before(deadline); {
						runtime.Gosched()
					}
					close(free)
				}()
			}
			var raised any
			func() {
				defer func() { raised = recover() }()
				_ = tc.drop(m)
			}()
			if want := fmt.Sprintf("drop hook failed on 3 (%v)", tc.reason); raised != want {
				t.Errorf("the caller recovered %v, want the last hook's panic, %q", raised, want)
			}
			if !slices.Equal(dropped, tc.want) {
				t.Errorf("OnDrop saw %v, want %v", dropped, tc.want)
			}
			if tc.name != "close" {
				close(free)
				m.Close()
			}
		})
	}
}

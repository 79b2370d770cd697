package partition_test

import (
	"slices"
	"testing"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

// A receipt's retry_after_ms was turned into a time.Duration by
// time.Duration(ms) * time.Millisecond (stream.go, judge), with no bound,
// where the ask path bounds the same hint to 10 s (mailbox.ErrorOf,
// maxRetryAfter) and the transport's own to 1 s.
//
//   - A hint up to ~292 years is taken as it is: one CAPACITY receipt
//     parks the stream (the deferral is persisted with opDefer) for
//     decades, also after the receiver has room again.
//   - A hint past 2^63 ns wraps: 9223372036855 ms is a negative
//     duration, so a NO_SUCH_ACTOR within the receiver's spawn grace
//     (ra > 0: wait, uncounted) becomes a counted attempt, and with
//     MaxAttempts 1 the message is dead-lettered; one millisecond less
//     and the stream waits 292 years instead.
//
// It is now at most a minute (maxRetryHint).
func TestReceiptRetryHintIsBounded(t *testing.T) {
	tests := []struct {
		name string
		code pb.Receipt_Code
		ms   int64
	}{
		{"capacity, 2^40 ms", pb.Receipt_CAPACITY, 1 << 40},
		{"no such actor, 2^63 ns + 1 ms", pb.Receipt_NO_SUCH_ACTOR, 9223372036855},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 1 }, func(c *partition.Config) { c.BatchSize = 4 })
			rg.fake.set(func(f *fake) { f.intercept = refuse(1, every(tt.code, tt.ms, 0)) })
			rg.queue(t, "a@n1", "m0")
			rg.relay.Start()
			testutil.WaitFor(t, wait, "the refused emission judged", func() bool {
				st := rg.store.Stats()
				return rg.relay.Stats().Deferred > 0 || st.DLQDepth > 0 || st.Retries > 0
			})
			if st := rg.store.Stats(); st.DLQDepth != 0 {
				dl, _ := rg.store.DeadLetters(outbox.DLQFilter{})
				t.Fatalf("dead-lettered (%q) after one %v receipt whose retry_after_ms %d wrapped negative", dl[0].Reason, tt.code, tt.ms)
			}
			// Within a minute (six times the ask path's bound) the stream
			// must be due again.
			due, next := rg.store.DueRecipients(rg.store.ElapsedMs()+60_000, nil, 10)
			if !slices.Contains(due, "a@n1") {
				t.Fatalf("after one %v receipt saying retry_after_ms %d the stream is due again only at elapsed %d ms (now %d): parked for %d days",
					tt.code, tt.ms, next, rg.store.ElapsedMs(), (next-rg.store.ElapsedMs())/86_400_000)
			}
		})
	}
}

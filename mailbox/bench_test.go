package mailbox_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// postAll posts n items, retrying on ErrMailboxFull as a sender honouring
// back-pressure would (yielding instead of sleeping RetryAfter).
func postAll(b *testing.B, m *mailbox.Mailbox[*pb.Envelope], env *pb.Envelope, n int) {
	for i := 0; i < n; {
		err := m.Post(env)
		switch {
		case err == nil:
			i++
		case errors.Is(err, mailbox.ErrMailboxFull):
			runtime.Gosched()
		default:
			b.Error(err)
			return
		}
	}
}

// BenchmarkPostHandle measures Post+Handle throughput with 1 and many posters.
func BenchmarkPostHandle(b *testing.B) {
	for _, posters := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("posters=%d", posters), func(b *testing.B) {
			var handled atomic.Int64
			m, err := mailbox.New(mailbox.Config[*pb.Envelope]{
				Capacity: mailbox.DefaultCapacity,
				Handle:   func(*pb.Envelope) { handled.Add(1) },
			})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			env := &pb.Envelope{MsgId: "m", Body: nil}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			per := b.N / posters
			done := make(chan struct{}, posters)
			for p := 0; p < posters; p++ {
				n := per
				if p == 0 {
					n += b.N % posters
				}
				go func() { postAll(b, m, env, n); done <- struct{}{} }()
			}
			for p := 0; p < posters; p++ {
				<-done
			}
			if err := m.Drain(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if handled.Load() != int64(b.N) {
				b.Fatalf("handled %d, want %d", handled.Load(), b.N)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			b.ReportMetric(float64(m.Stats().Wakeups)/float64(b.N), "wakeups/msg")
		})
	}
}

// BenchmarkPostFull measures the cost of a refused Post (the back-pressure path).
func BenchmarkPostFull(b *testing.B) {
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	m, err := mailbox.New(mailbox.Config[int]{Capacity: 16, Handle: func(int) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-gate
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	defer close(gate)
	_ = m.Post(0)
	<-started // item 0 holds the handler; the next 16 fill the queue
	for i := 1; i <= 16; i++ {
		if err := m.Post(i); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := m.Post(i); err == nil {
			b.Fatal("Post on a full mailbox succeeded")
		}
	}
}

// BenchmarkIdleMailboxMemory reports the heap cost of an idle mailbox.
func BenchmarkIdleMailboxMemory(b *testing.B) {
	for _, used := range []bool{false, true} {
		b.Run("used="+strconv.FormatBool(used), func(b *testing.B) {
			var per float64
			for i := 0; i < b.N; i++ {
				per = idleBytesPerMailbox(b, 100_000, used)
			}
			b.ReportMetric(per, "bytes/mailbox")
		})
	}
}

// BenchmarkRegistry measures one ask's registry work: Register + Deliver + receive.
func BenchmarkRegistry(b *testing.B) {
	r, err := mailbox.NewResponseRegistry(mailbox.DefaultRegistryConfig())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var next atomic.Int64
	b.RunParallel(func(pbt *testing.PB) {
		for pbt.Next() {
			id := strconv.FormatInt(next.Add(1), 36)
			ch, err := r.Register(id, "n2")
			if err != nil {
				b.Error(err)
				return
			}
			env := &pb.Envelope{Rpc: &pb.RpcMeta{CorrelationId: id}}
			if !r.Deliver("n2", env) {
				b.Error("not delivered")
				return
			}
			<-ch
		}
	})
}

var idSink atomic.Value

func BenchmarkNewID(b *testing.B) {
	b.ReportAllocs()
	b.RunParallel(func(pbt *testing.PB) {
		var id string
		for pbt.Next() {
			id = mailbox.NewID()
		}
		idSink.Store(id)
	})
}

func BenchmarkIdempotencyKeyFor(b *testing.B) {
	body := make([]byte, 128)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = mailbox.IdempotencyKeyFor("sender@n1", "recipient@n2", body)
	}
}

func BenchmarkStatusRoundTrip(b *testing.B) {
	err := &mailbox.CapacityError{RetryAfter: 50 * time.Millisecond}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		env := &pb.Envelope{}
		mailbox.SetError(env, err)
		if mailbox.ErrorOf(env) == nil {
			b.Fatal("lost error")
		}
	}
}

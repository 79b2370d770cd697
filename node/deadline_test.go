package node

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The lazy deadline behaves as context.WithDeadline does: Err from the
// clock, Done closing at the deadline or when the parent ends, and a Done
// asked for after release already closed.
func TestLazyDeadline(t *testing.T) {
	t.Run("before the deadline", func(t *testing.T) {
		c := withLazyDeadline(context.Background(), time.Now().Add(time.Hour))
		defer c.release()
		if dl, ok := c.Deadline(); !ok || time.Until(dl) < 59*time.Minute {
			t.Fatalf("Deadline = %v, %v", dl, ok)
		}
		if c.Err() != nil || c.child != nil {
			t.Fatalf("Err = %v (armed %v); want nil and no timer", c.Err(), c.child != nil)
		}
	})
	t.Run("deadline passes", func(t *testing.T) {
		c := withLazyDeadline(context.Background(), time.Now().Add(20*time.Millisecond))
		defer c.release()
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Done did not close at the deadline")
		}
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err = %v, want DeadlineExceeded", c.Err())
		}
	})
	t.Run("parent earlier", func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := withLazyDeadline(parent, time.Now().Add(time.Hour))
		defer c.release()
		if dl, _ := c.Deadline(); time.Until(dl) > time.Minute {
			t.Fatalf("Deadline %v is later than the parent's", dl)
		}
		cancel()
		<-c.Done()
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err = %v, want Canceled", c.Err())
		}
	})
	t.Run("released", func(t *testing.T) {
		c := withLazyDeadline(context.Background(), time.Now().Add(time.Hour))
		done := c.Done()
		c.release()
		<-done
		c2 := withLazyDeadline(context.Background(), time.Now().Add(time.Hour))
		c2.release()
		<-c2.Done() // asked for after the handler returned: over
	})
	t.Run("values", func(t *testing.T) {
		type key struct{}
		c := withLazyDeadline(context.WithValue(context.Background(), key{}, "v"), time.Now().Add(time.Hour))
		defer c.release()
		if c.Value(key{}) != "v" {
			t.Fatal("value of the parent lost")
		}
	})
}

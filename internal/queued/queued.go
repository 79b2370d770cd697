// Package queued lets the caller of a send learn, through its context,
// when the messages it passed are queued in order on their way: behind
// everything queued before them on the same path, ahead of anything
// queued after. The relay sends a stream's next emission only after its
// current one is queued, so the receiver takes the two in order; the
// transport and the node's local delivery say when.
package queued

import "context"

type key struct{}

// With returns ctx carrying fn, to be called by Signal.
func With(ctx context.Context, fn func()) context.Context {
	return context.WithValue(ctx, key{}, fn)
}

// Signal calls the function ctx carries, if any. A sender calls it once
// the messages are queued; one that never calls it only keeps its caller
// from sending the next ones early.
func Signal(ctx context.Context) {
	if fn, _ := ctx.Value(key{}).(func()); fn != nil {
		fn()
	}
}

package mailbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
)

func TestStatusRoundTrip(t *testing.T) {
	base := errors.New("boom")
	tests := []struct {
		name     string
		err      error
		code     mailbox.Code
		is       error // errors.Is target on the decoded error (nil: none)
		capacity bool  // decoded as *CapacityError
		perm     bool  // IsPermanent on the decoded error
	}{
		{"capacity", &mailbox.CapacityError{RetryAfter: 250 * time.Millisecond, Depth: 5, Capacity: 5}, mailbox.Capacity, mailbox.ErrMailboxFull, true, false},
		{"full sentinel", fmt.Errorf("post: %w", mailbox.ErrMailboxFull), mailbox.Capacity, mailbox.ErrMailboxFull, true, false},
		{"no such actor", fmt.Errorf("lookup: %w", mailbox.ErrNoSuchActor), mailbox.NoSuchActor, mailbox.ErrNoSuchActor, false, false},
		{"expired", mailbox.ErrExpired, mailbox.Expired, mailbox.ErrExpired, false, false},
		{"permanent", mailbox.Permanent(base), mailbox.Rejected, nil, false, true},
		{"deadline", fmt.Errorf("ask: %w", context.DeadlineExceeded), mailbox.DeadlineExceeded, context.DeadlineExceeded, false, false},
		{"canceled", context.Canceled, mailbox.Canceled, context.Canceled, false, false},
		{"closed", mailbox.ErrClosed, mailbox.Unavailable, nil, false, false},
		{"unknown", base, mailbox.Unknown, nil, false, false},
		{"remote transient", &mailbox.RemoteError{Code: mailbox.Transient, Message: "db busy"}, mailbox.Transient, nil, false, false},
		{"remote invalid", &mailbox.RemoteError{Code: mailbox.InvalidArgument, Message: "bad"}, mailbox.InvalidArgument, nil, false, false},
		{"remote internal", &mailbox.RemoteError{Code: mailbox.Internal}, mailbox.Internal, nil, false, false},
		{"remote unavailable", &mailbox.RemoteError{Code: mailbox.Unavailable}, mailbox.Unavailable, nil, false, false},
		{"remote rejected", &mailbox.RemoteError{Code: mailbox.Rejected}, mailbox.Rejected, nil, false, true},
		{"unknown method", mailbox.Permanent(fmt.Errorf("route: %w", mailbox.ErrUnknownMethod)), mailbox.Unimplemented, mailbox.ErrUnknownMethod, false, true},
		{"remote unimplemented", &mailbox.RemoteError{Code: mailbox.Unimplemented}, mailbox.Unimplemented, mailbox.ErrUnknownMethod, false, true},
		{"remote ok is not ok", &mailbox.RemoteError{Code: mailbox.OK}, mailbox.Unknown, nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := &pb.Envelope{}
			mailbox.SetError(env, tt.err)
			got := mailbox.ErrorOf(env)
			if got == nil {
				t.Fatalf("ErrorOf = nil for %v", tt.err)
			}
			if c := mailbox.CodeOf(got); c != tt.code {
				t.Fatalf("CodeOf(decoded) = %v, want %v (headers %v)", c, tt.code, env.Headers)
			}
			if tt.is != nil && !errors.Is(got, tt.is) {
				t.Errorf("decoded %v does not match %v", got, tt.is)
			}
			var ce *mailbox.CapacityError
			if errors.As(got, &ce) != tt.capacity {
				t.Errorf("decoded %T, capacity error expected %v", got, tt.capacity)
			}
			if tt.capacity {
				if ce.RetryAfter <= 0 {
					t.Errorf("RetryAfter %v, want > 0", ce.RetryAfter)
				}
			} else {
				var re *mailbox.RemoteError
				if !errors.As(got, &re) {
					t.Fatalf("decoded %T, want *RemoteError", got)
				}
				if re.Message != tt.err.Error() {
					t.Errorf("message %q, want %q", re.Message, tt.err.Error())
				}
			}
			if mailbox.IsPermanent(got) != tt.perm {
				t.Errorf("IsPermanent = %v, want %v", !tt.perm, tt.perm)
			}
		})
	}
}

func TestRetryAfterTravels(t *testing.T) {
	env := &pb.Envelope{Headers: map[string]string{"app": "x"}}
	mailbox.SetError(env, &mailbox.CapacityError{RetryAfter: 1500 * time.Millisecond})
	var ce *mailbox.CapacityError
	if !errors.As(mailbox.ErrorOf(env), &ce) || ce.RetryAfter != 1500*time.Millisecond {
		t.Fatalf("decoded %+v", ce)
	}
	if env.Headers["app"] != "x" {
		t.Fatal("SetError clobbered an application header")
	}
}

func TestSetErrorNil(t *testing.T) {
	env := &pb.Envelope{}
	mailbox.SetError(env, nil)
	if env.Headers != nil {
		t.Fatalf("headers %v after SetError(nil)", env.Headers)
	}
	mailbox.SetError(nil, errors.New("x")) // must not panic
	if err := mailbox.ErrorOf(env); err != nil {
		t.Fatalf("ErrorOf(no headers) = %v", err)
	}
	if err := mailbox.ErrorOf(nil); err != nil {
		t.Fatalf("ErrorOf(nil) = %v", err)
	}
}

func TestErrorOfMalformed(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    mailbox.Code // OK means nil error
		wantRA  time.Duration
	}{
		{"ok", map[string]string{mailbox.HeaderStatusCode: "0"}, mailbox.OK, 0},
		{"non-numeric code", map[string]string{mailbox.HeaderStatusCode: "full"}, mailbox.Unknown, 0},
		{"huge code", map[string]string{mailbox.HeaderStatusCode: "99999999999"}, mailbox.Unknown, 0},
		{"unknown code", map[string]string{mailbox.HeaderStatusCode: "77"}, mailbox.Unknown, 0},
		{"negative code", map[string]string{mailbox.HeaderStatusCode: "-3"}, mailbox.Unknown, 0},
		{"capacity bad retry", map[string]string{mailbox.HeaderStatusCode: "2", mailbox.HeaderRetryAfterMs: "soon"}, mailbox.Unknown, 0},
		{"capacity no retry", map[string]string{mailbox.HeaderStatusCode: "2"}, mailbox.Capacity, 10 * time.Millisecond},
		{"capacity negative retry", map[string]string{mailbox.HeaderStatusCode: "2", mailbox.HeaderRetryAfterMs: "-5"}, mailbox.Capacity, 10 * time.Millisecond},
		{"capacity huge retry clamped", map[string]string{mailbox.HeaderStatusCode: "2", mailbox.HeaderRetryAfterMs: "9223372036854775807"}, mailbox.Capacity, 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := mailbox.ErrorOf(&pb.Envelope{Headers: tt.headers})
			if c := mailbox.CodeOf(err); c != tt.want {
				t.Fatalf("ErrorOf = %v (code %v), want code %v", err, c, tt.want)
			}
			var ce *mailbox.CapacityError
			if errors.As(err, &ce) && ce.RetryAfter != tt.wantRA {
				t.Fatalf("RetryAfter = %v, want %v", ce.RetryAfter, tt.wantRA)
			}
			if err != nil && err.Error() == "" {
				t.Fatal("empty error message")
			}
		})
	}
}

func TestPermanent(t *testing.T) {
	base := errors.New("bad input")
	if mailbox.Permanent(nil) != nil {
		t.Fatal("Permanent(nil) != nil")
	}
	p := mailbox.Permanent(base)
	if !errors.Is(p, base) || !mailbox.IsPermanent(p) || p.Error() != base.Error() {
		t.Fatalf("Permanent(base) = %v", p)
	}
	wrapped := fmt.Errorf("handle: %w", p)
	if !mailbox.IsPermanent(wrapped) || !errors.Is(mailbox.Permanent(wrapped), wrapped) {
		t.Fatal("wrapped permanent error lost its mark or was wrapped twice")
	}
	if mailbox.IsPermanent(base) || mailbox.IsPermanent(nil) {
		t.Fatal("plain error reported permanent")
	}
}

func TestCodeString(t *testing.T) {
	seen := map[string]bool{}
	for c := mailbox.OK; c <= mailbox.Unimplemented; c++ {
		s := c.String()
		if s == "" || seen[s] {
			t.Fatalf("code %d has empty or duplicate name %q", c, s)
		}
		seen[s] = true
	}
	if s := mailbox.Code(42).String(); s != "Code(42)" {
		t.Fatalf("Code(42).String() = %q", s)
	}
}

// FuzzErrorOf: status headers come from the network; decoding them must
// never panic and must never turn a present non-OK code into nil.
func FuzzErrorOf(f *testing.F) {
	f.Add("2", "full", "50")
	f.Add("5", "poison", "")
	f.Add("x", "", "y")
	f.Add("-1", "neg", "-1")
	f.Add("0", "", "")
	f.Fuzz(func(t *testing.T, code, msg, retry string) {
		env := &pb.Envelope{Headers: map[string]string{
			mailbox.HeaderStatusCode:    code,
			mailbox.HeaderStatusMessage: msg,
			mailbox.HeaderRetryAfterMs:  retry,
		}}
		err := mailbox.ErrorOf(env)
		if err == nil {
			if n, perr := strconv.ParseInt(code, 10, 32); perr != nil || n != 0 {
				t.Fatalf("nil error for code %q", code)
			}
			return
		}
		_ = err.Error()
		var ce *mailbox.CapacityError
		if errors.As(err, &ce) && ce.RetryAfter <= 0 {
			t.Fatalf("non-positive RetryAfter %v", ce.RetryAfter)
		}
		// Re-encoding a decoded error keeps its code.
		out := &pb.Envelope{}
		mailbox.SetError(out, err)
		if got, want := mailbox.CodeOf(mailbox.ErrorOf(out)), mailbox.CodeOf(err); got != want {
			t.Fatalf("re-encoded code %v, want %v", got, want)
		}
	})
}

package badconfig

import (
	"errors"
	"testing"
)

var (
	errParent = errors.New("parent: bad config")
	errSub    = errors.New("sub: bad config")
	errKey    = errors.New("sub: key must be 32 bytes")
)

func TestWithinReadsOnceAndMatchesEverySentinel(t *testing.T) {
	for _, tc := range []struct {
		name string
		sub  error
		want string
		is   []error
	}{
		{"detail", New(errSub, "Max must be >= %d", 1), "parent: bad config: Sub: Max must be >= 1", []error{errParent, errSub}},
		{"cause", &Error{Sentinel: errSub, Detail: "Key is 3 bytes", Cause: errKey}, "parent: bad config: Sub: Key is 3 bytes", []error{errParent, errSub, errKey}},
		{"foreign", errKey, "parent: bad config: Sub: sub: key must be 32 bytes", []error{errParent, errKey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Within(errParent, "Sub", tc.sub)
			if err.Error() != tc.want {
				t.Errorf("got %q, want %q", err, tc.want)
			}
			for _, s := range tc.is {
				if !errors.Is(err, s) {
					t.Errorf("errors.Is(%v, %v) is false", err, s)
				}
			}
		})
	}
	if errors.Is(New(errSub, "x"), errParent) {
		t.Error("a sub-config error matches the parent's sentinel before Within")
	}
}

package transport_test

import (
	"errors"
	"testing"

	"github.com/meshnode/meshnode/transport"
)

// A close code is matched by meaning, not by the text of its reason.
func TestCloseErrorMatchesSentinels(t *testing.T) {
	for _, tc := range []struct {
		code         transport.CloseError
		incompatible bool
	}{
		{transport.CloseError{Code: transport.CodeIncompatible, Reason: "other cluster", Remote: true}, true},
		{transport.CloseError{Code: transport.CodeNameMismatch, Reason: "name", Remote: true}, true},
		{transport.CloseError{Code: transport.CodeGoAway, Remote: true}, false},
		{transport.CloseError{Code: transport.CodeProtocol, Reason: "bad frame", Remote: true}, false},
	} {
		err := error(&tc.code)
		if errors.Is(err, transport.ErrIncompatible) != tc.incompatible || errors.Is(err, transport.ErrConnLost) == tc.incompatible {
			t.Errorf("%v: Is(ErrIncompatible) = %v, Is(ErrConnLost) = %v", err, errors.Is(err, transport.ErrIncompatible), errors.Is(err, transport.ErrConnLost))
		}
	}
}

package node

import (
	"fmt"
	"strings"

	"github.com/meshnode/meshnode/internal/address"
)

// Address names an actor on a node: "actor@node".
type Address struct {
	Actor string
	Node  string
}

// Addr builds an Address.
func Addr(actor, node string) Address { return Address{Actor: actor, Node: node} }

// String returns "actor@node".
func (a Address) String() string { return a.Actor + "@" + a.Node }

// IsZero reports whether a is the zero Address.
func (a Address) IsZero() bool { return a.Actor == "" && a.Node == "" }

// Validate checks both parts are non-empty names without '@' or spaces.
func (a Address) Validate() error {
	if err := validName(a.Actor); err != nil {
		return fmt.Errorf("%w: actor %q: %w", ErrBadAddress, a.Actor, err)
	}
	if err := validName(a.Node); err != nil {
		return fmt.Errorf("%w: node %q: %w", ErrBadAddress, a.Node, err)
	}
	return nil
}

// ParseAddress parses "actor@node".
func ParseAddress(s string) (Address, error) {
	actor, nodeName, ok := address.Split(s)
	if !ok {
		return Address{}, fmt.Errorf("%w: %q: want actor@node", ErrBadAddress, s)
	}
	a := Address{Actor: actor, Node: nodeName}
	if err := a.Validate(); err != nil {
		return Address{}, err
	}
	return a, nil
}

func validName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty")
	case len(s) > 255:
		return fmt.Errorf("longer than 255 bytes")
	case strings.ContainsAny(s, "@ \t\r\n\x00"):
		return fmt.Errorf("contains '@', a space or a control character")
	}
	return nil
}

//go:build !linux

package testnet

import (
	"context"
	"fmt"
	"net"
	"runtime"
)

// NetnsAvailable reports why WithNetns cannot work here: network
// namespaces are Linux only.
func NetnsAvailable() error {
	return fmt.Errorf("%w: %s is not Linux", ErrNoNetns, runtime.GOOS)
}

// nsNet is never created off Linux; its methods exist for the build.
type nsNet struct{ id string }

func newNsNet() (*nsNet, error)                         { return nil, NetnsAvailable() }
func (x *nsNet) addNode(int) (ip, ns string, err error) { return "", "", NetnsAvailable() }
func (x *nsNet) setLink(int, bool) error                { return NetnsAvailable() }
func (x *nsNet) close() error                           { return nil }
func (x *nsNet) dialer(int) func(context.Context, string, string) (net.Conn, error) {
	return func(context.Context, string, string) (net.Conn, error) { return nil, NetnsAvailable() }
}

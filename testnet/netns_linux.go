//go:build linux

package testnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// NetnsAvailable reports why WithNetns cannot work here, or nil: it needs
// Linux, root, iproute2's `ip`, and an `ip netns add` that succeeds (a
// probe namespace is created and deleted).
func NetnsAvailable() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root (euid %d)", ErrNoNetns, os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: iproute2 `ip` not found: %w", ErrNoNetns, err)
	}
	probe := "mnt-" + randHex(4) + "-probe"
	if err := ipCmd("netns", "add", probe); err != nil {
		return fmt.Errorf("%w: %w", ErrNoNetns, err)
	}
	if err := ipCmd("netns", "del", probe); err != nil {
		return fmt.Errorf("%w: delete probe namespace: %w", ErrNoNetns, err)
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ipCmd runs `ip args...`; its output is in the error.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// nsNet is the namespaces of one ProcCluster: a hub namespace holding a
// bridge, and one namespace per node joined to it by a veth pair ("eth0"
// in the node's namespace, "h<i>" on the bridge). Addresses are
// 10.213.<random>.<i+1>/24; nothing is created in the caller's namespace,
// so no address outside these namespaces is ever used.
type nsNet struct {
	id     string // random, in every namespace name
	subnet string // "10.213.X"
	hub    string

	// mu guards the fields below.
	mu     sync.Mutex
	nodes  map[int]string // index -> namespace
	closed bool
}

func newNsNet() (*nsNet, error) {
	if err := NetnsAvailable(); err != nil {
		return nil, err
	}
	var b [1]byte
	_, _ = rand.Read(b[:])
	x := &nsNet{id: randHex(3), subnet: fmt.Sprintf("10.213.%d", b[0]), nodes: make(map[int]string)}
	x.hub = "mnt-" + x.id + "-hub"
	for _, args := range [][]string{
		{"netns", "add", x.hub},
		{"-n", x.hub, "link", "add", "br0", "type", "bridge"},
		{"-n", x.hub, "link", "set", "br0", "up"},
	} {
		if err := ipCmd(args...); err != nil {
			_ = x.close()
			return nil, fmt.Errorf("testnet: netns hub: %w", err)
		}
	}
	return x, nil
}

// addNode creates node i's namespace and link; it returns its address and
// namespace name.
func (x *nsNet) addNode(i int) (ip, ns string, err error) {
	if i < 0 || i > 250 {
		return "", "", fmt.Errorf("testnet: netns: %w: %d (at most 251 nodes)", ErrBadIndex, i)
	}
	ns = fmt.Sprintf("mnt-%s-%d", x.id, i)
	ip = fmt.Sprintf("%s.%d", x.subnet, i+1)
	x.mu.Lock()
	x.nodes[i] = ns // recorded first: close deletes it even if a step below fails
	x.mu.Unlock()
	hostDev := fmt.Sprintf("h%d", i)
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", hostDev, "netns", x.hub},
		{"-n", ns, "addr", "add", ip + "/24", "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", x.hub, "link", "set", hostDev, "master", "br0"},
		{"-n", x.hub, "link", "set", hostDev, "up"},
	} {
		if err := ipCmd(args...); err != nil {
			return "", "", fmt.Errorf("testnet: netns of node %d: %w", i, err)
		}
	}
	return ip, ns, nil
}

// setLink takes node i's link on the bridge down or up. Down, nothing
// passes between the node and any other: gossip and QUIC both stop.
func (x *nsNet) setLink(i int, up bool) error {
	x.mu.Lock()
	_, ok := x.nodes[i]
	x.mu.Unlock()
	if !ok {
		return fmt.Errorf("testnet: netns: %w: %d", ErrBadIndex, i)
	}
	state := "down"
	if up {
		state = "up"
	}
	if err := ipCmd("-n", x.hub, "link", "set", fmt.Sprintf("h%d", i), state); err != nil {
		return fmt.Errorf("testnet: link of node %d %s: %w", i, state, err)
	}
	return nil
}

// close deletes every namespace it made; deleting a namespace destroys
// the veth ends in it, so no link outlives it. Idempotent.
func (x *nsNet) close() error {
	x.mu.Lock()
	if x.closed {
		x.mu.Unlock()
		return nil
	}
	x.closed = true
	names := []string{x.hub}
	for _, ns := range x.nodes {
		names = append(names, ns)
	}
	x.mu.Unlock()
	var errs []error
	for _, ns := range names {
		if _, err := os.Stat("/run/netns/" + ns); errors.Is(err, os.ErrNotExist) {
			continue // never created (a failed step)
		}
		if err := ipCmd("netns", "del", ns); err != nil {
			errs = append(errs, fmt.Errorf("testnet: netns cleanup: %w", err))
		}
	}
	return errors.Join(errs...)
}

// dialer returns a DialContext that opens connections from inside node
// i's namespace, so the test process reaches the admin API on the
// namespace's loopback without exposing it. The socket is created on an
// OS thread switched into the namespace; a socket keeps the namespace it
// was created in. If the thread cannot be switched back it is not
// unlocked, so the runtime discards it instead of reusing it.
func (x *nsNet) dialer(i int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		x.mu.Lock()
		ns := x.nodes[i]
		x.mu.Unlock()
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			c, err := dialInNetns(ctx, "/run/netns/"+ns, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch // DialContext honours ctx, so this wait is bounded
		return r.c, r.err
	}
}

func dialInNetns(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("testnet: netns dial: own namespace: %w", err)
	}
	defer func() { _ = orig.Close() }()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("testnet: netns dial: %w", err)
	}
	defer func() { _ = target.Close() }()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("testnet: netns dial: setns %s: %w", nsPath, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr == nil {
		runtime.UnlockOSThread()
	} // else: keep the thread locked; it exits with this goroutine
	if err != nil {
		return nil, fmt.Errorf("testnet: netns dial %s: %w", addr, err)
	}
	return c, nil
}

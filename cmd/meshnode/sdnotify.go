package main

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// sdNotify sends a state line ("READY=1", "STATUS=...") to systemd when the
// daemon runs under a Type=notify unit ($NOTIFY_SOCKET set); elsewhere it
// does nothing. The protocol is one datagram on a unix socket, so the
// daemon needs no systemd library.
func sdNotify(states ...string) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if strings.HasPrefix(addr, "@") { // abstract socket
		addr = "\x00" + addr[1:]
	}
	conn, err := net.DialTimeout("unixgram", addr, time.Second)
	if err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := conn.Write([]byte(strings.Join(states, "\n"))); err != nil {
		return fmt.Errorf("notify systemd: %w", err)
	}
	return nil
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, which systemd wants
// with RELOADING=1.
func monotonicUsec() string {
	return fmt.Sprintf("MONOTONIC_USEC=%d", monotonicNow()/1000)
}

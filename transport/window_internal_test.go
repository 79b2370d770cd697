package transport

import (
	"testing"

	"github.com/quic-go/quic-go"
)

// The receive windows quic-go is given follow Config.StreamWindow: each
// stream's is the setting, fixed, and the connection's is twice the
// streams' together (the lanes the Hello announces, at least the default,
// and control).
func TestReceiveWindowsFollowStreamWindow(t *testing.T) {
	for _, tc := range []struct {
		window, lanes int
		conn          uint64
	}{
		{512 << 10, defaultLanes, 2 * 17 * 512 << 10},
		{4 << 20, defaultLanes, 2 * 17 * 4 << 20},
		{64 << 10, 4, 2 * 17 * 64 << 10},
		{1 << 20, 32, 2 * 33 * 1 << 20},
	} {
		cfg := DefaultConfig("n1")
		cfg.StreamWindow, cfg.Lanes = tc.window, tc.lanes
		var q quic.Config
		setReceiveWindows(&q, cfg)
		if q.InitialStreamReceiveWindow != uint64(tc.window) || q.MaxStreamReceiveWindow != uint64(tc.window) {
			t.Errorf("window %d: stream windows %d..%d, want %d fixed", tc.window, q.InitialStreamReceiveWindow, q.MaxStreamReceiveWindow, tc.window)
		}
		if q.InitialConnectionReceiveWindow != tc.conn || q.MaxConnectionReceiveWindow != tc.conn {
			t.Errorf("window %d, %d lanes: connection windows %d..%d, want %d fixed", tc.window, tc.lanes, q.InitialConnectionReceiveWindow, q.MaxConnectionReceiveWindow, tc.conn)
		}
	}
}

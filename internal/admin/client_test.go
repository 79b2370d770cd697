package admin

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeResponse(t *testing.T) {
	type members struct {
		Members []MemberJSON `json:"members"`
	}
	tests := []struct {
		name    string
		status  int
		body    string
		wantErr error
		wantMsg string
	}{
		{"ok", 200, `{"members":[{"name":"n0","state":"alive"}]}`, nil, ""},
		{"error JSON", 409, `{"error":"inbox: ack beyond the last message","code":"conflict"}`, nil, "ack beyond"},
		{"error text", 502, `bad gateway`, nil, "bad gateway"},
		{"not JSON", 200, `<html>`, ErrBadResponse, ""},
		{"wrong shape", 200, `{"members":7}`, ErrBadResponse, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out members
			err := DecodeResponse(tt.status, []byte(tt.body), &out)
			var ae *APIError
			switch {
			case tt.wantMsg != "":
				if !errors.As(err, &ae) || ae.Status != tt.status || !strings.Contains(ae.Error(), tt.wantMsg) {
					t.Fatalf("err %v, want an APIError %d naming %q", err, tt.status, tt.wantMsg)
				}
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
			default:
				if err != nil || len(out.Members) != 1 || out.Members[0].Name != "n0" {
					t.Fatalf("decoded %+v, err %v", out, err)
				}
			}
		})
	}
}

// FuzzDecodeResponse: answers of a daemon are bytes from another process;
// decoding them gives a value or an error, never a panic.
func FuzzDecodeResponse(f *testing.F) {
	f.Add(200, []byte(`{"messages":[{"cursor":1,"msg_id":"m","body":{"seq":1}}],"next_after":1}`))
	f.Add(200, []byte(`{"outcome":"Delivered"}`))
	f.Add(409, []byte(`{"error":"x"}`))
	f.Add(500, []byte{0xff, 0x00})
	f.Add(200, []byte(`{"messages":[{"cursor":-1,"raw":"!!"}]}`))
	f.Fuzz(func(t *testing.T, status int, data []byte) {
		var out struct {
			Messages []InboxMessageJSON `json:"messages"`
		}
		err := DecodeResponse(status, data, &out)
		if (status < 200 || status > 299) && err == nil {
			t.Fatalf("status %d decoded without error", status)
		}
	})
}

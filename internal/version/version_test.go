package version

import (
	"runtime/debug"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFromBuildInfo(t *testing.T) {
	tests := []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want Info
	}{
		{"no build info", nil, false, Info{Version: "unknown", Revision: "unknown"}},
		{"checkout build with VCS", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}},
			true, Info{Version: "(devel)", Revision: "0123456789abcdef0123", Modified: true, GoVersion: "go1.26.8"}},
		{"module version", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}},
			true, Info{Version: "v1.2.3", Revision: "unknown", GoVersion: "go1.26.8"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := fromBuildInfo(tt.bi, tt.ok)
			if tt.want.GoVersion == "" {
				tt.want.GoVersion = got.GoVersion // the running toolchain's
			}
			tt.want.Platform = got.Platform
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestStringIsOneLine(t *testing.T) {
	s := Info{Version: "v1.2.3", Revision: "0123456789abcdef", Modified: true, GoVersion: "go1.26.8", Platform: "linux/amd64"}.String()
	if want := "meshnode v1.2.3 (rev 0123456789ab+modified, go1.26.8, linux/amd64)"; s != want || strings.Contains(s, "\n") {
		t.Fatalf("String() = %q, want %q", s, want)
	}
}

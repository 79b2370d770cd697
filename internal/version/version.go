// Package version reports what binary is running: the module version and
// the VCS revision the Go toolchain stamped into it (runtime/debug), for
// `meshnode version`, the admin API's /version and meshnode_build_info.
//
//	info := version.Get()
//	fmt.Println(info) // meshnode v1.2.3 (rev 0123abcd, go1.26.8, linux/amd64)
//
// A binary built from a checkout with `go build` reports version "(devel)"
// and, when the build had VCS information, the revision and whether the tree
// was modified. Nothing here fails: missing information is "unknown".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
)

// Info describes the running binary.
type Info struct {
	Version   string `json:"version"`    // module version, "(devel)" for a checkout build
	Revision  string `json:"revision"`   // VCS revision, "unknown" without VCS information
	Modified  bool   `json:"modified"`   // the working tree had uncommitted changes
	GoVersion string `json:"go_version"` // toolchain that built it
	Platform  string `json:"platform"`   // GOOS/GOARCH
}

// String is one line for humans.
func (i Info) String() string {
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if i.Modified {
		rev += "+modified"
	}
	return fmt.Sprintf("meshnode %s (rev %s, %s, %s)", i.Version, rev, i.GoVersion, i.Platform)
}

var get = sync.OnceValue(func() Info { return fromBuildInfo(debug.ReadBuildInfo()) })

// Get returns the running binary's information (read once).
func Get() Info { return get() }

// fromBuildInfo is Get's logic, apart for tests.
func fromBuildInfo(bi *debug.BuildInfo, ok bool) Info {
	info := Info{Version: "unknown", Revision: "unknown", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if !ok || bi == nil {
		return info
	}
	if bi.Main.Version != "" {
		info.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

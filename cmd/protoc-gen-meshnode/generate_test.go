package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// plugin builds the plugin (once per test binary) and finds Debian's
// protoc and the pinned protoc-gen-go; the tests skip without protoc
// (apt-get install protobuf-compiler), as make generate needs it too.
func plugin(t *testing.T) (protoc, self, gogen string) {
	t.Helper()
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Skip("protoc not installed")
	}
	build.Do(func() {
		dir, err := os.MkdirTemp("", "protoc-gen-meshnode-test-")
		if err != nil {
			build.err = err
			return
		}
		build.dir = dir
		build.self = filepath.Join(dir, "protoc-gen-meshnode")
		if out, err := exec.Command("go", "build", "-o", build.self, ".").CombinedOutput(); err != nil {
			build.err = fmt.Errorf("build plugin: %w\n%s", err, out)
			return
		}
		out, err := exec.Command("go", "tool", "-n", "protoc-gen-go").Output()
		if err != nil {
			build.err = fmt.Errorf("find protoc-gen-go: %w", err)
			return
		}
		build.gogen = strings.TrimSpace(string(out))
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return protoc, build.self, build.gogen
}

// build is the plugin built for this test binary; TestMain removes it.
var build struct {
	sync.Once
	dir, self, gogen string
	err              error
}

func run(t *testing.T, protoc, self, gogen, srcDir, outDir, file string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(protoc, "--plugin=protoc-gen-go="+gogen, "--plugin=protoc-gen-meshnode="+self,
		"--go_out="+outDir, "--go_opt=paths=source_relative",
		"--meshnode_out="+outDir, "--meshnode_opt=paths=source_relative", file)
	cmd.Dir = srcDir
	return cmd.CombinedOutput()
}

// TestExampleGeneratedCodeIsCommitted: what the plugin generates for the
// example service is byte for byte what is committed.
func TestExampleGeneratedCodeIsCommitted(t *testing.T) {
	protoc, self, gogen := plugin(t)
	src := filepath.Join("..", "..", "examples", "device", "devicepb")
	out := t.TempDir()
	if msg, err := run(t, protoc, self, gogen, src, out, "device.proto"); err != nil {
		t.Fatalf("protoc: %v\n%s", err, msg)
	}
	for _, f := range []string{"device.pb.go", "device_meshnode.pb.go"} {
		got, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what the plugin generates: run make generate and commit", f)
		}
	}
}

// TestStreamingMethodRefused: a streaming method fails generation with a
// reason instead of producing a client that cannot work.
func TestStreamingMethodRefused(t *testing.T) {
	protoc, self, gogen := plugin(t)
	src := t.TempDir()
	proto := `syntax = "proto3";
package s.v1;
option go_package = "example.com/s";
message M {}
service S { rpc Watch(M) returns (stream M); }
`
	if err := os.WriteFile(filepath.Join(src, "s.proto"), []byte(proto), 0o600); err != nil {
		t.Fatal(err)
	}
	msg, err := run(t, protoc, self, gogen, src, t.TempDir(), "s.proto")
	if err == nil || !strings.Contains(string(msg), "streams") {
		t.Fatalf("protoc: err %v, output %q; want a refusal naming the streaming method", err, msg)
	}
}

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// meshnodeBin is the binary the end-to-end tests drive, built once without
// -race (the daemons are real processes; the race detector would only slow
// them down).
var meshnodeBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshnode-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	meshnodeBin = filepath.Join(dir, "meshnode")
	build := exec.Command("go", "build", "-o", meshnodeBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	code := 0
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build meshnode:", err)
		code = 1
	} else {
		code = m.Run()
		// goleak.VerifyTestMain would exit before the cleanup below; this is
		// its check. Every exec'd process was waited for, so no goroutine of
		// os/exec may remain.
		if code == 0 {
			if err := goleak.Find(); err != nil {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				code = 1
			}
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

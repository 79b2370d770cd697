// Command meshnode runs a meshnode daemon and operates it. See doc.go.
package main

import (
	"fmt"
	"os"
)

func main() {
	err := newRootCmd().Execute()
	if err != nil {
		fmt.Fprintln(os.Stderr, "meshnode: "+err.Error())
	}
	os.Exit(exitCode(err))
}

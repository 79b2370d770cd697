// Command meshnode runs a meshnode daemon and operates it. See doc.go.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "meshnode: "+err.Error())
		os.Exit(1)
	}
}

//go:build !linux

// Command iii-guest-agent is the init of a Linux sandbox VM; built for
// another OS it only says so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "iii-guest-agent runs only inside a Linux VM: build it with GOOS=linux (CGO_ENABLED=0)")
	os.Exit(2)
}

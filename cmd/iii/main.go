// Command iii is the iii engine and its command line: `iii` runs the engine
// from config.yaml, `iii call` calls a function on a running engine.
package main

import (
	"os"

	"github.com/mattn/go-isatty"
)

func main() {
	os.Exit(run(os.Args[1:], env{
		stdin:       os.Stdin,
		stdout:      os.Stdout,
		stderr:      os.Stderr,
		interactive: isatty.IsTerminal(os.Stdin.Fd()) || isatty.IsCygwinTerminal(os.Stdin.Fd()),
		getenv:      os.Getenv,
	}))
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Exit codes of the iii command.
const (
	exitOK          = 0
	exitFailure     = 1   // the command ran and failed (remote error, unreachable engine, timeout, bad config)
	exitUsage       = 2   // the command line itself is wrong
	exitInterrupted = 130 // SIGINT/SIGTERM stopped a call (128 + SIGINT)
)

// env is what the process gives the commands; tests fill it themselves.
type env struct {
	stdin       io.Reader
	stdout      io.Writer
	stderr      io.Writer
	interactive bool // stdin is a terminal
	getenv      func(string) string
}

// usageError is a command line that cannot run; it exits 2 with a hint.
type usageError struct {
	err  error
	hint string // the command whose --help explains the usage
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(cmd *cobra.Command, format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...), hint: cmd.CommandPath()}
}

// exitError is a failure whose message is already in its final shape.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// run executes the command line and returns the process exit code. Every
// failure is printed once, as "Error: <message>" on stderr.
func run(args []string, e env) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal asks for a clean stop; restoring the default action
	// then lets a second one end the process at once.
	go func() {
		<-ctx.Done()
		stop()
	}()

	root := newRootCmd(e)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ue *usageError
	var ee *exitError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "Error: %s\nRun '%s --help' for usage.\n", ue.err, ue.hint)
		return exitUsage
	case errors.As(err, &ee):
		fmt.Fprintf(e.stderr, "Error: %s\n", ee.msg)
		return ee.code
	default:
		// Cobra's own argument errors ("unknown command ...") are usage
		// errors too; everything else from a command is a failure.
		if isCobraUsageError(err) {
			fmt.Fprintf(e.stderr, "Error: %s\nRun 'iii --help' for usage.\n", err)
			return exitUsage
		}
		fmt.Fprintf(e.stderr, "Error: %s\n", err)
		return exitFailure
	}
}

// isCobraUsageError recognises the few errors cobra returns itself before a
// command runs (flag errors are wrapped by the flag error func instead).
func isCobraUsageError(err error) bool {
	msg := err.Error()
	for _, prefix := range []string{"unknown command", "accepts ", "requires ", "invalid argument", "unknown flag", "unknown shorthand flag"} {
		if len(msg) >= len(prefix) && msg[:len(prefix)] == prefix {
			return true
		}
	}
	return false
}

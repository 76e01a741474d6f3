package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/compose/daemon"
)

// engineLifeline ties an engine started by `iii compose --up` to Compose:
// Compose passes the read end of a pipe whose fd is in
// $III_ENGINE_LIFELINE_FD and keeps the write end. When Compose dies (even
// by SIGKILL) the kernel closes the write end, the read sees EOF, and the
// engine stops as it does on SIGTERM, stopping its sandbox adapters first.
// Without the variable the engine runs as usual.
func engineLifeline(ctx context.Context, e env, log hclog.Logger) (context.Context, func()) {
	v := e.getenv(daemon.EnvEngineLifeline)
	if v == "" {
		return ctx, func() {}
	}
	// Not for the engine's own children (adapters): they must not hold
	// the pipe open nor see the variable.
	_ = os.Unsetenv(daemon.EnvEngineLifeline)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		log.Warn("ignoring a malformed lifeline fd", "env", daemon.EnvEngineLifeline, "value", v)
		return ctx, func() {}
	}
	syscall.CloseOnExec(fd)
	// Compose reads the engine's stdout and stderr; once it is gone they
	// are broken pipes, and a Go program that writes to a broken stdout or
	// stderr dies of SIGPIPE unless it asks for the signal. Asking turns
	// those writes into errors, so the engine lives to stop its adapters.
	sigpipe := make(chan os.Signal, 1)
	signal.Notify(sigpipe, syscall.SIGPIPE)
	// Non-blocking, so the read goes through the poller and Close ends it.
	_ = syscall.SetNonblock(fd, true)
	f := os.NewFile(uintptr(fd), "compose-lifeline")
	if f == nil {
		signal.Stop(sigpipe)
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(io.Discard, f)
		if ctx.Err() == nil {
			log.Info("the Compose that started this engine is gone; stopping")
		}
		cancel()
	}()
	return ctx, func() {
		cancel()
		_ = f.Close()
		<-done
		signal.Stop(sigpipe)
	}
}

package proc

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/compose"
)

// Hook is a script Compose runs around a worker (scripts.pre_run,
// scripts.post_run): in its own process group, with the worker's
// environment and working directory.
type Hook struct {
	// Name is the hook's key in the compose file, for messages.
	Name string
	// Container is the container the hook belongs to, for messages.
	Container string
	Command   string
	Dir       string
	Env       []string
	// Timeout ends a hook that runs too long; 0 means no limit.
	Timeout time.Duration
	// StopGrace is the grace between SIGTERM and SIGKILL when the hook is
	// ended early.
	StopGrace time.Duration
	// Log receives the hook's output (the worker's log).
	Log *Log
}

// hookTailLines is how many log lines a failed hook's message carries.
const hookTailLines = 5

// Run runs the hook to completion. Errors: HOOK_SPAWN_FAILED (it could not
// be started), HOOK_TIMEOUT (it ran past Timeout and was stopped),
// HOOK_FAILED (it exited non-zero), or ctx's error when ctx ended first
// (the hook is stopped then too).
func (h Hook) Run(ctx context.Context) error {
	if h.Log != nil {
		_ = h.Log.Write(Stderr, []byte(fmt.Sprintf("[compose] running %s: %s", h.Name, h.Command)))
	}
	p, err := Start(Spec{Command: h.Command, Dir: h.Dir, Env: h.Env, Log: h.Log})
	if err != nil {
		return compose.New(compose.CodeHookSpawnFailed, fmt.Sprintf("container %q: %s `%s` could not be started: %v", h.Container, h.Name, h.Command, err))
	}
	wctx := ctx
	var cancel context.CancelFunc
	if h.Timeout > 0 {
		wctx, cancel = context.WithTimeout(ctx, h.Timeout)
		defer cancel()
	}
	waitErr := p.Wait(wctx)
	if waitErr == nil {
		// The leader is done; members it left behind end with it.
		stopCtx, stopCancel := context.WithTimeout(context.Background(), h.grace()+5*time.Second)
		_ = p.Stop(stopCtx, h.grace())
		stopCancel()
		if st := p.ExitStatus(); st != "exit status 0" {
			return compose.New(compose.CodeHookFailed, fmt.Sprintf("container %q: %s `%s` failed (%s)%s", h.Container, h.Name, h.Command, st, h.tail()))
		}
		return nil
	}
	stopCtx, stopCancel := context.WithTimeout(context.Background(), h.grace()+5*time.Second)
	_ = p.Stop(stopCtx, h.grace())
	stopCancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	hint := "make the hook finish sooner"
	if h.Name == "pre_run" {
		hint = "raise scripts.pre_run_timeout or make the hook finish sooner"
	}
	return compose.New(compose.CodeHookTimeout, fmt.Sprintf("container %q: %s `%s` did not finish within %s and was stopped; %s%s",
		h.Container, h.Name, h.Command, h.Timeout, hint, h.tail()))
}

func (h Hook) grace() time.Duration {
	if h.StopGrace > 0 {
		return h.StopGrace
	}
	return 10 * time.Second
}

func (h Hook) tail() string {
	if h.Log == nil {
		return ""
	}
	lines := TailLines(h.Log.Dir(), h.Log.Name(), hookTailLines)
	if len(lines) == 0 {
		return ""
	}
	return "; last output:\n  " + strings.Join(lines, "\n  ")
}

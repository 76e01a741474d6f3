package proc

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

func TestHookOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		command string
		dir     func(t *testing.T) string
		timeout time.Duration
		code    string
		msg     string
	}{
		{name: "success", command: "echo migrated"},
		{name: "fails", command: "echo boom >&2; exit 3", code: compose.CodeHookFailed, msg: "(exit status 3); last output:\n  [compose] running pre_run: echo boom >&2; exit 3\n  boom"},
		{name: "timeout", command: "sleep 300", timeout: 200 * time.Millisecond, code: compose.CodeHookTimeout, msg: "raise scripts.pre_run_timeout"},
		{name: "spawn failed", command: "true", dir: func(t *testing.T) string { return filepath.Join(t.TempDir(), "missing") },
			code: compose.CodeHookSpawnFailed, msg: "could not be started"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logDir := t.TempDir()
			l, err := OpenLog(logDir, "api", LogOptions{})
			assert.NilError(t, err)
			defer l.Close()
			h := Hook{Name: "pre_run", Container: "api", Command: tc.command, Env: testEnv(), Timeout: tc.timeout,
				StopGrace: 200 * time.Millisecond, Log: l}
			if tc.dir != nil {
				h.Dir = tc.dir(t)
			}
			err = h.Run(ctxT(t))
			if tc.code == "" {
				assert.NilError(t, err)
				assert.Check(t, is.Contains(TailLines(logDir, "api", 5), "migrated"))
				return
			}
			assert.Equal(t, compose.CodeOf(err), tc.code, "%v", err)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

// A hook cancelled with its context is stopped and returns the context's
// error, not a hook code.
func TestHookCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Hook{Name: "pre_run", Container: "api", Command: "sleep 300", Env: testEnv(), StopGrace: 100 * time.Millisecond}.Run(ctx)
	}()
	cancel()
	err := waitfor.Recv(t, done, waitfor.Default, "the cancelled hook to return")
	assert.ErrorIs(t, err, context.Canceled)
}

package engineproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/state"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Start's failures before the engine listens: each says why with its
// code, and the engine lock is free again (after Stop when a process
// ran), so a second `iii compose --up` can take the project.
func TestStartFailures(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	freePort := free.Addr().(*net.TCPAddr).Port
	assert.NilError(t, free.Close())

	tests := []struct {
		name string
		port int
		// script is the engine executable's body (sh).
		script   string
		tokenErr error
		code     string
		contains string
		started  bool
	}{
		{name: "port taken", port: taken.Addr().(*net.TCPAddr).Port, script: "exit 0",
			code: compose.CodeManagedEngineListenerUnavailable, contains: "stop whatever holds the port"},
		{name: "no token", port: freePort, script: "exit 0", tokenErr: compose.New(compose.CodeIOError, "no token file"),
			code: compose.CodeIOError, contains: "no token file"},
		{name: "engine exits", port: freePort, script: "echo \"cannot read $2\" >&2; exit 3",
			code: compose.CodeEngineExited, contains: "cannot read ", started: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			exe := filepath.Join(dir, "iii")
			assert.NilError(t, os.WriteFile(exe, []byte("#!/bin/sh\n"+tc.script+"\n"), 0o755))
			_, f := newProject(t, fmt.Sprintf("engine:\n  url: ws://127.0.0.1:%d\ncontainers: {}\n", tc.port))
			stateDir := filepath.Join(dir, "state")
			lock, err := state.LockEngine(stateDir, f.Path, f.Namespace)
			assert.NilError(t, err)
			store, err := state.Open(stateDir, f.Path, f.Namespace)
			assert.NilError(t, err)
			defer store.Close()
			var out bytes.Buffer
			m, err := Start(context.Background(), Spec{
				File: f, Lock: lock, Store: store, Executable: exe,
				Token:  func() (string, error) { return "t0k", tc.tokenErr },
				Logger: hclog.NewNullLogger(), Out: &out,
			})
			assert.Check(t, is.Equal(compose.CodeOf(err), tc.code), "%v", err)
			assert.Check(t, is.ErrorContains(err, tc.contains))
			assert.Check(t, is.Equal(m != nil, tc.started))
			if m != nil {
				assert.Check(t, m.Stop(context.Background()))
				_, serr := os.Stat(store.EngineConfigPath())
				assert.Check(t, errors.Is(serr, os.ErrNotExist), "the generated config is removed at stop: %v", serr)
			}
			assert.Check(t, is.Equal(out.String(), ""))
			again, err := state.LockEngine(stateDir, f.Path, f.Namespace)
			assert.NilError(t, err, "the engine lock was not released")
			again.Release()
		})
	}
}

//go:build linux

package agentclient

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// lines collects a spawned process's output per stream.
type lines struct {
	mu  sync.Mutex
	out map[agentproto.Kind]*bytes.Buffer
}

func (l *lines) sink(kind agentproto.Kind, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.out == nil {
		l.out = map[agentproto.Kind]*bytes.Buffer{}
	}
	if l.out[kind] == nil {
		l.out[kind] = &bytes.Buffer{}
	}
	l.out[kind].Write(p)
}

func (l *lines) get(kind agentproto.Kind) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.out[kind] == nil {
		return ""
	}
	return l.out[kind].String()
}

// TestSpawnStreamsWithoutCap: a spawned process's output is not capped
// like an exec's (8 MiB here, past the 1 MiB exec cap) and comes whole, in
// order, before its exit status.
func TestSpawnStreamsWithoutCap(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()
	var l lines
	p, err := c.Spawn(ctx, agentproto.SpawnRequest{Name: "worker",
		Argv: []string{"/bin/sh", "-c", "head -c 8388608 /dev/zero | tr '\\0' x; echo; echo oops >&2; exit 3"}}, l.sink)
	assert.NilError(t, err)
	assert.Assert(t, p.PID > 0)
	es, err := p.Wait(ctx)
	assert.NilError(t, err)
	assert.Equal(t, es.ExitCode, 3)
	assert.Equal(t, len(l.get(agentproto.KindStdout)), 8<<20+1)
	assert.Equal(t, l.get(agentproto.KindStderr), "oops\n")
}

// TestStopProcGraceful: ProcStop sends SIGTERM first; a process that
// handles it exits by itself within the grace.
func TestStopProcGraceful(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()
	var l lines
	p, err := c.Spawn(ctx, agentproto.SpawnRequest{Name: "worker",
		Argv: []string{"/bin/sh", "-c", "trap 'echo bye; exit 0' TERM; echo up; while :; do sleep 0.05; done"}}, l.sink)
	assert.NilError(t, err)
	waitFor(t, func() bool { return strings.Contains(l.get(agentproto.KindStdout), "up") })

	// A second process under the same name is refused while it runs.
	_, err = c.Spawn(ctx, agentproto.SpawnRequest{Name: "worker", Argv: []string{"true"}}, nil)
	assert.ErrorContains(t, err, "already running")

	res, err := c.StopProc(ctx, "worker", 10_000)
	assert.NilError(t, err)
	assert.DeepEqual(t, res, &agentproto.ProcStopResult{Stopped: true})
	es, err := p.Wait(ctx)
	assert.NilError(t, err)
	assert.Equal(t, es.ExitCode, 0)
	assert.Check(t, is.Contains(l.get(agentproto.KindStdout), "bye"))

	// Nothing runs under the name any more.
	res, err = c.StopProc(ctx, "worker", 0)
	assert.NilError(t, err)
	assert.Check(t, !res.Stopped)
}

// TestStopProcKillsAfterGrace: a process that ignores SIGTERM is killed,
// with what it started, once the grace is over.
func TestStopProcKillsAfterGrace(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()
	var l lines
	p, err := c.Spawn(ctx, agentproto.SpawnRequest{Name: "stubborn",
		Argv: []string{"/bin/sh", "-c", "trap '' TERM; sleep 100 & echo up; wait"}}, l.sink)
	assert.NilError(t, err)
	waitFor(t, func() bool { return strings.Contains(l.get(agentproto.KindStdout), "up") })
	res, err := c.StopProc(ctx, "stubborn", 50)
	assert.NilError(t, err)
	assert.DeepEqual(t, res, &agentproto.ProcStopResult{Stopped: true, Killed: true})
	es, err := p.Wait(ctx)
	assert.NilError(t, err)
	assert.Check(t, es.Signal != 0 || es.Canceled, "killed, not exited: %+v", es)
}

func TestSpawnMissingProgram(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	var l lines
	p, err := c.Spawn(context.Background(), agentproto.SpawnRequest{Name: "w", Argv: []string{"/no/such/program"}}, l.sink)
	assert.NilError(t, err)
	assert.Equal(t, p.PID, 0)
	es, err := p.Wait(context.Background())
	assert.NilError(t, err)
	assert.Equal(t, es.ExitCode, 127)
	assert.Check(t, is.Contains(l.get(agentproto.KindStderr), "command not found"))
}

func tarOf(t *testing.T, entries ...*tar.Header) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Uname))
			body = h.Uname
			h.Uname = ""
		} else if h.Typeflag == tar.TypeSymlink {
			body = ""
		}
		assert.NilError(t, tw.WriteHeader(h))
		if h.Typeflag == tar.TypeReg {
			_, err := tw.Write([]byte(body))
			assert.NilError(t, err)
		}
	}
	assert.NilError(t, tw.Close())
	return &buf
}

// file is a tar header for a regular file; Uname carries the content.
func file(name, content string, mode int64) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uname: content, ModTime: time.Unix(1_700_000_000, 0)}
}

func dirEntry(name string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}
}

// TestWorkspaceUnpackAndPrune: files and links land, a link planted where
// the archive has a directory is replaced rather than written through, and
// pruning removes what the archive dropped but keeps the kept names.
func TestWorkspaceUnpackAndPrune(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx := context.Background()
	ws := filepath.Join(env.root, "workspace")
	outside := t.TempDir()

	first := tarOf(t, dirEntry("src/"), file("src/main.js", "console.log(1)\n", 0o644),
		file("run.sh", "#!/bin/sh\n", 0o755), file("old.txt", "old", 0o644),
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "link", Linkname: "src/main.js"})
	res, err := c.Workspace(ctx, agentproto.WorkspaceRequest{Dir: ws, Prune: true, Keep: []string{"node_modules"}}, first)
	assert.NilError(t, err)
	assert.DeepEqual(t, res, &agentproto.WorkspaceResult{Files: 3, Dirs: 1, Symlinks: 1, Bytes: int64(len("console.log(1)\n#!/bin/sh\nold"))})
	fi, err := os.Stat(filepath.Join(ws, "run.sh"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), os.FileMode(0o755))
	assert.Equal(t, fi.ModTime().Unix(), int64(1_700_000_000))

	// What the guest made itself: an install product, and a link that
	// points out of the workspace where the next archive has a directory.
	assert.NilError(t, os.MkdirAll(filepath.Join(ws, "node_modules", "dep"), 0o755))
	assert.NilError(t, os.MkdirAll(filepath.Join(ws, "src", "node_modules"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(ws, "stray.log"), []byte("x"), 0o644))
	assert.NilError(t, os.Symlink(outside, filepath.Join(ws, "lib")))

	second := tarOf(t, dirEntry("src/"), file("src/main.js", "console.log(2)\n", 0o600),
		dirEntry("lib/"), file("lib/evil.txt", "inside", 0o644), file("run.sh", "#!/bin/sh\necho\n", 0o755))
	res, err = c.Workspace(ctx, agentproto.WorkspaceRequest{Dir: ws, Prune: true, Keep: []string{"node_modules"}}, second)
	assert.NilError(t, err)
	assert.Equal(t, res.Removed, int64(3), "old.txt, link and stray.log go; node_modules stays at any depth")

	b, err := os.ReadFile(filepath.Join(ws, "src", "main.js"))
	assert.NilError(t, err)
	assert.Equal(t, string(b), "console.log(2)\n")
	des, err := os.ReadDir(outside)
	assert.NilError(t, err)
	assert.Check(t, is.Len(des, 0), "nothing was written through the planted link")
	fi, err = os.Lstat(filepath.Join(ws, "lib"))
	assert.NilError(t, err)
	assert.Check(t, fi.IsDir())
	for _, gone := range []string{"old.txt", "link", "stray.log"} {
		_, err := os.Lstat(filepath.Join(ws, gone))
		assert.Check(t, os.IsNotExist(err), gone)
	}
	for _, kept := range []string{"node_modules/dep", "src/node_modules"} {
		_, err := os.Stat(filepath.Join(ws, kept))
		assert.Check(t, err, kept)
	}
}

func TestWorkspaceRefusesEscapes(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ws := filepath.Join(env.root, "workspace")
	for _, name := range []string{"../escape.txt", "/etc/abs.txt", "a/../../b"} {
		_, err := c.Workspace(context.Background(), agentproto.WorkspaceRequest{Dir: ws}, tarOf(t, file(name, "x", 0o644)))
		assert.ErrorContains(t, err, "workspace:", name)
	}
	_, err := os.Stat(filepath.Join(env.root, "escape.txt"))
	assert.Check(t, os.IsNotExist(err))
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

package runner

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// longGraceMS is a grace no test waits out: a runner that is still there
// within waitfor.Default was kept, and one that is gone was not.
const longGraceMS = 120_000

// shortStateDir is a state_dir whose sockets fit sun_path whatever the
// test's name (t.TempDir's paths grow with it).
func shortStateDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", "rn")
	assert.NilError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// spawnAdoptable spawns a runner (of the fake VM) that may be adopted for
// graceMS and waits for its VM to start.
func spawnAdoptable(t *testing.T, graceMS uint64) (*Dir, *Process) {
	t.Helper()
	d, err := CreateDir(shortStateDir(t), uuid1)
	assert.NilError(t, err)
	t.Cleanup(func() { _ = d.Remove() })
	cfg := testConfig(d.Path, "")
	cfg.AdoptGraceMS = graceMS
	p, err := Spawn(context.Background(), SpawnOptions{Executable: os.Args[0], Dir: d, Config: cfg})
	assert.NilError(t, err)
	t.Cleanup(func() { killProcess(t, p) })
	waitFile(t, d.File("vm-started"))
	return d, p
}

func killProcess(t *testing.T, p *Process) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	defer cancel()
	assert.Check(t, p.Kill(ctx))
}

// reopen is a new adapter's view of d: the old one's lock dropped, the
// directory opened again.
func reopen(t *testing.T, d *Dir) *Dir {
	t.Helper()
	d.Release()
	d2, err := OpenDir(filepath.Dir(d.Path), filepath.Base(d.Path))
	assert.NilError(t, err)
	t.Cleanup(func() { _ = d2.Remove() })
	return d2
}

func adopt(t *testing.T, d *Dir) *Process {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	defer cancel()
	p, err := Adopt(ctx, d)
	assert.NilError(t, err)
	t.Cleanup(func() { killProcess(t, p) })
	return p
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	assert.NilError(t, err)
	return string(b)
}

// waitLog waits until runner.log holds want.
func waitLog(t *testing.T, d *Dir, want string) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		b, _ := os.ReadFile(d.File(LogName))
		if !strings.Contains(string(b), want) {
			return poll.Continue("runner.log does not say %q yet", want)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(10*time.Millisecond))
}

// TestAdoptKeepsTheVM: an adapter detaches, a new one adopts the runner
// within its grace; the VM was never stopped, the adopted Process names
// the runner, and its Done closes when the runner exits (here on SIGTERM,
// which stops the VM whatever the grace).
func TestAdoptKeepsTheVM(t *testing.T) {
	d, p := spawnAdoptable(t, longGraceMS)
	for _, name := range []string{AdoptSocketName, AdoptKeyName} {
		fi, err := os.Lstat(d.File(name))
		assert.NilError(t, err)
		assert.Check(t, is.Equal(fi.Mode().Perm(), os.FileMode(0o600)), name)
	}
	p.Detach()
	waitLog(t, d, "adapter gone; keeping the VM for 2m0s for a new adapter")
	d2 := reopen(t, d)
	p2 := adopt(t, d2)
	assert.Equal(t, p2.PID, p.PID)
	assert.Check(t, !exists(d.File("vm-stopped")), "the VM was stopped")
	select {
	case <-p2.Done():
		t.Fatal("the adopted runner is done while it runs")
	default:
	}

	assert.NilError(t, syscall.Kill(p.PID, syscall.SIGTERM))
	waitfor.Closed(t, p2.Done(), waitfor.Default, "the adopted Process to see its runner exit")
	waitfor.Closed(t, p.Done(), waitfor.Default, "the runner to be reaped")
	assert.NilError(t, p.ExitErr())
	assert.NilError(t, p2.ExitErr())
	assert.Check(t, is.Contains(readFile(t, d.File("vm-stopped")), "signal"))
	assert.Check(t, !exists(d.File(AdoptSocketName)), "the adoption socket outlived its runner")
}

// TestAdoptedReleaseKillsTheVM: Release through an adopted lifeline stops
// the VM at once, not after the grace.
func TestAdoptedReleaseKillsTheVM(t *testing.T) {
	d, p := spawnAdoptable(t, longGraceMS)
	p.Detach()
	p2 := adopt(t, reopen(t, d))
	p2.Release()
	waitfor.Closed(t, p2.Done(), waitfor.Default, "the released runner to exit")
	waitfor.Closed(t, p.Done(), waitfor.Default, "the released runner to be reaped")
	assert.NilError(t, p.ExitErr())
	assert.Check(t, is.Contains(readFile(t, d.File("vm-stopped")), "released"))
}

// TestDetachWithoutAdoption: a runner nobody adopts kills its VM and
// exits once its grace is over.
func TestDetachWithoutAdoption(t *testing.T) {
	d, p := spawnAdoptable(t, 1000)
	p.Detach()
	waitfor.Closed(t, p.Done(), waitfor.Default, "the runner to exit after its grace")
	assert.NilError(t, p.ExitErr())
	assert.Check(t, is.Contains(readFile(t, d.File("vm-stopped")), "no adapter adopted the VM within 1s"))
	assert.Check(t, is.Contains(readFile(t, d.File(LogName)), "keeping the VM for 1s"))
	assert.Check(t, !exists(d.File(AdoptSocketName)))
	_, err := Adopt(context.Background(), reopen(t, d))
	assert.Check(t, errors.Is(err, ErrNoRunner), "%v", err)
}

// TestAdoptWrongKey: a process without the key is refused and logged, and
// the runner goes on as before: the right key still adopts it. Clients
// that hang up, send junk or too long a line change nothing either.
func TestAdoptWrongKey(t *testing.T) {
	d, p := spawnAdoptable(t, longGraceMS)
	p.Detach()
	d2 := reopen(t, d)
	key, err := os.ReadFile(d2.File(AdoptKeyName))
	assert.NilError(t, err)
	assert.Equal(t, len(key), keyLen)
	wrong := append([]byte(nil), key...)
	wrong[0] ^= 1
	assert.NilError(t, os.WriteFile(d2.File(AdoptKeyName), wrong, 0o600))
	_, err = Adopt(context.Background(), d2)
	assert.Check(t, errors.Is(err, ErrRefused), "%v", err)
	waitLog(t, d, "did not prove it holds the key")

	for name, send := range map[string]string{
		"hang up":   "",
		"junk":      "GET / HTTP/1.0\n",
		"long line": strings.Repeat("A", 4*maxLine),
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("unix", d2.File(AdoptSocketName))
			assert.NilError(t, err)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(waitfor.Default))
			hello, err := readLine(c, maxLine)
			assert.NilError(t, err)
			_, err = parseHello(hello)
			assert.NilError(t, err)
			if send == "" {
				return
			}
			_, _ = io.WriteString(c, send)
			reply, err := readLine(c, maxLine)
			assert.NilError(t, err)
			assert.Equal(t, reply, "NO protocol")
		})
	}

	assert.NilError(t, os.WriteFile(d2.File(AdoptKeyName), key, 0o600))
	p2 := adopt(t, d2)
	assert.Check(t, !exists(d.File("vm-stopped")))
	p2.Release()
	waitfor.Closed(t, p2.Done(), waitfor.Default, "the released runner to exit")
}

// TestAdoptBusy: nobody takes a runner over from a live adapter, even
// with the key; once that adapter detaches, the new one may.
func TestAdoptBusy(t *testing.T) {
	d, p := spawnAdoptable(t, longGraceMS)
	d2 := reopen(t, d)
	_, err := Adopt(context.Background(), d2)
	assert.Check(t, errors.Is(err, ErrRefused), "%v", err)
	assert.Check(t, is.ErrorContains(err, "busy"))
	assert.Check(t, !exists(d.File("vm-stopped")))

	p.Detach()
	p2 := adopt(t, d2)
	_, err = Adopt(context.Background(), d2)
	assert.Check(t, is.ErrorContains(err, "busy"), "a second adopter while the first holds it")
	p2.Release()
	waitfor.Closed(t, p2.Done(), waitfor.Default, "the released runner to exit")
}

// TestSecondAdoption: an adopter that detaches hands the runner on to the
// next; the first adopter's Done still means "the runner has exited".
func TestSecondAdoption(t *testing.T) {
	d, p := spawnAdoptable(t, longGraceMS)
	p.Detach()
	d2 := reopen(t, d)
	p2 := adopt(t, d2)
	p2.Detach()
	p3 := adopt(t, d2)
	assert.Check(t, !exists(d.File("vm-stopped")))
	select {
	case <-p2.Done():
		t.Fatal("the first adopter's Done closed while the runner runs")
	default:
	}
	p3.Release()
	waitfor.Closed(t, p3.Done(), waitfor.Default, "the released runner to exit")
	waitfor.Closed(t, p2.Done(), waitfor.Default, "the first adopter to see the runner exit")
	assert.Check(t, is.Contains(readFile(t, d.File("vm-stopped")), "released"))
}

// TestReleaseWithGraceKillsAtOnce: the stop byte on the pipe stops the VM
// whatever the grace.
func TestReleaseWithGraceKillsAtOnce(t *testing.T) {
	d, p := spawnAdoptable(t, longGraceMS)
	p.Release()
	waitfor.Closed(t, p.Done(), waitfor.Default, "the released runner to exit")
	assert.NilError(t, p.ExitErr())
	assert.Check(t, is.Contains(readFile(t, d.File("vm-stopped")), "the adapter released the VM (lifeline: stop)"))
}

// TestNoGraceNoAdoption: without a grace a runner serves no socket, has no
// key, and a detach kills its VM at once, as it always did.
func TestNoGraceNoAdoption(t *testing.T) {
	d, p := spawnAdoptable(t, 0)
	assert.Check(t, !exists(d.File(AdoptSocketName)))
	assert.Check(t, !exists(d.File(AdoptKeyName)))
	_, err := Adopt(context.Background(), reopen(t, d))
	assert.Check(t, errors.Is(err, ErrNoRunner), "%v", err)
	p.Detach()
	waitfor.Closed(t, p.Done(), waitfor.Default, "the detached runner to exit")
	assert.Check(t, is.Contains(readFile(t, d.File("vm-stopped")), "lifeline: EOF"))
}

// TestAdoptAfterAdapterKilled: an adapter killed with SIGKILL leaves its
// runner to a new one, which is not the runner's parent: Kill signals it
// by pid and sees it go.
func TestAdoptAfterAdapterKilled(t *testing.T) {
	dir := filepath.Join(shortStateDir(t), uuid1)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envSpawner+"="+dir, envGrace+"="+strconv.Itoa(longGraceMS))
	out, err := cmd.StdoutPipe()
	assert.NilError(t, err)
	assert.NilError(t, cmd.Start())
	var line string
	waitfor.Func(t, waitfor.Default, "the spawner to print the runner's pid", func() { line, err = bufio.NewReader(out).ReadString('\n') })
	assert.NilError(t, err, "the spawner said nothing")
	runnerPID, err := strconv.Atoi(strings.TrimSpace(line))
	assert.NilError(t, err, "the spawner said %q", line)
	t.Cleanup(func() {
		if BelongsTo(procArgs(runnerPID), dir) {
			kill(runnerPID)
		}
	})
	waitFile(t, filepath.Join(dir, "vm-started"))
	assert.NilError(t, cmd.Process.Kill())
	waitfor.Func(t, waitfor.Default, "the killed spawner to be reaped", func() { _ = cmd.Wait() })

	d, err := OpenDir(filepath.Dir(dir), filepath.Base(dir))
	assert.NilError(t, err)
	t.Cleanup(func() { _ = d.Remove() })
	p := adopt(t, d)
	assert.Equal(t, p.PID, runnerPID)
	assert.Check(t, !exists(filepath.Join(dir, "vm-stopped")))
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	defer cancel()
	assert.NilError(t, p.Kill(ctx))
	assert.Check(t, !alive(runnerPID))
	waitfor.Closed(t, p.Done(), waitfor.Default, "the killed runner's connection to end")
}

// TestAdoptNeedsAHeldDir: Adopt works only on a directory this process
// holds.
func TestAdoptNeedsAHeldDir(t *testing.T) {
	_, err := Adopt(context.Background(), &Dir{Path: "/nonexistent"})
	assert.ErrorContains(t, err, "holds")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d, err := CreateDir(shortStateDir(t), uuid1)
	assert.NilError(t, err)
	defer func() { assert.Check(t, d.Remove()) }()
	_, err = Adopt(ctx, d)
	assert.ErrorIs(t, err, context.Canceled)
}

// TestOpenDir: an existing state directory with its lock file opens and
// is locked; anything else does not.
func TestOpenDir(t *testing.T) {
	state := shortStateDir(t)
	held, err := CreateDir(state, uuid1)
	assert.NilError(t, err)
	defer func() { assert.Check(t, held.Remove()) }()
	_, err = OpenDir(state, uuid1)
	assert.Check(t, errors.Is(err, ErrLocked), "%v", err)
	held.Release()
	d, err := OpenDir(state, uuid1)
	assert.NilError(t, err)
	_, err = OpenDir(state, uuid1)
	assert.Check(t, errors.Is(err, ErrLocked), "a directory OpenDir holds: %v", err)
	assert.NilError(t, d.Remove())

	const (
		noLock = "aaaaaaaa-0000-4000-8000-000000000001"
		file   = "aaaaaaaa-0000-4000-8000-000000000002"
		link   = "aaaaaaaa-0000-4000-8000-000000000003"
	)
	assert.NilError(t, os.Mkdir(filepath.Join(state, noLock), 0o700))
	assert.NilError(t, os.WriteFile(filepath.Join(state, file), nil, 0o600))
	assert.NilError(t, os.Symlink(filepath.Join(state, noLock), filepath.Join(state, link)))
	for _, tc := range []struct {
		name, dir, want string
	}{
		{"missing", uuid1, "no such file"},
		{"no lock file", noLock, "no such file"},
		{"a file", file, "not a directory"},
		{"a symlink", link, "not a directory"},
		{"not a sandbox id", "../x", "not a sandbox id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := OpenDir(state, tc.dir)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	assert.Check(t, !exists(filepath.Join(state, noLock, LockName)), "OpenDir made a lock file")
}

// TestAdoptKeyFile: the key is read only from a private regular file of
// the right size; anything else is an error, never a hang.
func TestAdoptKeyFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	assert.NilError(t, writeAdoptKey(good))
	k1, err := readAdoptKey(good)
	assert.NilError(t, err)
	assert.NilError(t, writeAdoptKey(good))
	k2, err := readAdoptKey(good)
	assert.NilError(t, err)
	assert.Check(t, string(k1) != string(k2), "a new runner must get a new key")

	short := filepath.Join(dir, "short")
	assert.NilError(t, os.WriteFile(short, []byte("x"), 0o600))
	open := filepath.Join(dir, "open")
	assert.NilError(t, os.WriteFile(open, k1, 0o644))
	assert.NilError(t, os.Chmod(open, 0o644))
	link := filepath.Join(dir, "link")
	assert.NilError(t, os.Symlink(good, link))
	fifo := filepath.Join(dir, "fifo")
	assert.NilError(t, syscall.Mkfifo(fifo, 0o600))
	for _, tc := range []struct{ path, want string }{
		{short, "holds 1 bytes"},
		{open, "owner alone"},
		{link, "adoption key"},
		{fifo, "not a regular file"},
		{filepath.Join(dir, "none"), "no such file"},
	} {
		t.Run(filepath.Base(tc.path), func(t *testing.T) {
			_, err := readAdoptKey(tc.path)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	_, err = readAdoptKey(filepath.Join(dir, "none"))
	assert.Check(t, errors.Is(err, fs.ErrNotExist))
}

// TestConfigAdoptGrace: the grace round-trips through runner.json and is
// bounded.
func TestConfigAdoptGrace(t *testing.T) {
	cfg := testConfig("/s/x", "")
	cfg.AdoptGraceMS = 30_000
	b, err := cfg.Encode()
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), `"adopt_grace_ms": 30000`))
	got, err := DecodeConfig(b)
	assert.NilError(t, err)
	assert.Equal(t, got.AdoptGrace(), 30*time.Second)
	cfg.AdoptGraceMS = MaxAdoptGraceMS + 1
	_, err = cfg.Encode()
	assert.ErrorContains(t, err, "adopt_grace_ms")
}

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/procscan"
)

// TestLeftoversCleanedAtStart simulates a crashed run: an adapter is
// killed with SIGKILL while one of its runners and its QEMU are frozen
// (SIGSTOP), so that runner cannot obey its lifeline and both stay. The next adapter
// on the same state_dir kills both (after checking their command lines)
// and removes every stale directory, while it leaves alone the VMs of an
// adapter that is still alive, and directories it did not make.
func TestLeftoversCleanedAtStart(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	stateDir := dirs.Short(t, "sb")
	foreign := filepath.Join(stateDir, "keep-me")
	assert.NilError(t, os.Mkdir(foreign, 0o700))

	a := start(t, e, stateDir, nil)
	ids := createN(t, a, 2)
	frozen, stale := ids[0], ids[1]

	// A second adapter starting on the same state_dir leaves the first
	// one's live VMs alone.
	b := start(t, e, stateDir, nil)
	assert.Equal(t, a.sh(t, frozen, "echo alive"), "alive\n")
	own := b.create(t, nil)

	runnerPID := readPID(t, filepath.Join(stateDir, frozen, "runner.pid"))
	vmPID := readPID(t, filepath.Join(stateDir, frozen, "vm.pid"))
	// Freeze the VM too: a guest whose host end goes away may power
	// itself off, and this test is about what the clean-up kills.
	assert.NilError(t, syscall.Kill(runnerPID, syscall.SIGSTOP))
	assert.NilError(t, syscall.Kill(vmPID, syscall.SIGSTOP))
	// kill(2) only queues SIGSTOP: the group stop starts when one of the
	// process's threads is next scheduled, and until then another thread
	// can still run. Under load the runner's lifeline thread once woke on
	// the adapter's death first and killed its QEMU, so wait until every
	// thread of both has stopped.
	procscan.WaitStopped(t, runnerPID)
	procscan.WaitStopped(t, vmPID)
	assert.NilError(t, syscall.Kill(a.pid, syscall.SIGKILL))
	// The other runner obeys its lifeline.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if left := procsUnder(filepath.Join(stateDir, stale)); len(left) > 0 {
			return poll.Continue("still running: %v", left)
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Second), poll.WithDelay(20*time.Millisecond))
	if !processAlive(vmPID) {
		t.Fatalf("the frozen runner's QEMU should still run\nrunner: %s\nQEMU: %s\nits logs:\n%s",
			procReport(runnerPID), procReport(vmPID), dirLogs(filepath.Join(stateDir, frozen)))
	}
	assert.Assert(t, is.Contains(dirs.Names(t, stateDir), frozen))
	assert.Assert(t, is.Contains(dirs.Names(t, stateDir), stale))

	c := start(t, e, stateDir, nil)
	info := c.info(t)
	assert.Equal(t, info["leftovers_cleaned"], float64(2))
	assert.Assert(t, !processAlive(runnerPID), "the frozen runner survived the clean-up")
	assert.Assert(t, !processAlive(vmPID), "the frozen runner's QEMU survived the clean-up")
	assert.DeepEqual(t, sandboxDirs(t, stateDir), []string{own, "keep-me"})
	assert.Check(t, is.Len(procsUnder(filepath.Join(stateDir, frozen)), 0))

	// The live adapter's VM was not touched.
	assert.Equal(t, b.sh(t, own, "echo still here"), "still here\n")
	b.stop(t, own)
	assert.DeepEqual(t, sandboxDirs(t, stateDir), []string{"keep-me"})
}

// TestBootFailureLeavesNothing makes every boot miss its deadline: create
// fails with S300 carrying the VM's logs, and the failed boot leaves no
// process or directory behind.
func TestBootFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), map[string]any{"boot_timeout_ms": 1})
	se := p.fail(t, contract.OpCreate, map[string]any{"image": "python"}, contract.S300)
	assert.Check(t, is.Contains(se.Message, "did not start"))
	assert.Check(t, is.Contains(se.Message, "boot_timeout_ms 1"))
	assert.Check(t, is.Len(sandboxDirs(t, p.stateDir), 0))
	assert.Check(t, is.Len(sandboxProcs(p.stateDir), 0))
	var list contract.ListResponse
	p.call(t, contract.OpList, nil, &list)
	assert.Check(t, is.Len(list.Sandboxes, 0))
}

// TestLibkrunUnavailable asks for libkrun on a host without it: create
// fails with S300 saying what to install, and nothing is left behind.
func TestLibkrunUnavailable(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	if libkrunInstalled() {
		t.Skip("libkrun is installed here; this test is about a host without it")
	}
	p := start(t, e, dirs.Short(t, "sb"), map[string]any{"hypervisor": "libkrun"})
	se := p.fail(t, contract.OpCreate, map[string]any{"image": "python"}, contract.S300)
	assert.Check(t, is.Contains(se.Message, "libkrun"))
	assert.Check(t, is.Contains(se.Message, "install"))
	info := p.info(t)
	assert.Equal(t, info["backend_state"], "failed")
	assert.Check(t, is.Len(sandboxDirs(t, p.stateDir), 0))
}

// TestConfigRejected starts the adapter with configurations that cannot
// work: each is refused at start, naming the key.
func TestConfigRejected(t *testing.T) {
	e := needVMs(t)
	for key, bad := range map[string]any{
		"accel":           "hvf",
		"state_dir":       "relative/dir",
		"boot_timeout_ms": "soon",
		"hypervisor":      "firecracker",
		"kernel":          42,
	} {
		t.Run(key, func(t *testing.T) {
			_, err := startErr(t, e, dirs.Short(t, "sb"), map[string]any{key: bad})
			assert.ErrorContains(t, err, key)
		})
	}
}

// TestInfoReportsBackend checks adapter::info names the back end chosen,
// the accelerator, the kernel, and why the others were skipped.
func TestInfoReportsBackend(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), nil)
	id := p.create(t, nil) // waits for the back end to be chosen
	defer p.stop(t, id)
	info := p.info(t)
	assert.Equal(t, info["backend_state"], "ready")
	assert.Equal(t, info["hypervisor"], "qemu")
	assert.Check(t, info["accel"] == "kvm" || info["accel"] == "tcg", "accel %v", info["accel"])
	assert.Check(t, is.Contains(info["kernel"], "vmlinuz"))
	assert.Equal(t, info["live_vms"], float64(1))
	skipped, _ := info["skipped"].([]any)
	if !libkrunInstalled() {
		assert.Assert(t, len(skipped) > 0 && strings.HasPrefix(skipped[0].(string), "libkrun: "), "skipped: %v", skipped)
	}
	probe, _ := info["accel_probe"].([]any)
	assert.Assert(t, len(probe) > 0, "no accel_probe in %v", info)
}

func readPID(t *testing.T, p string) int {
	t.Helper()
	b, err := os.ReadFile(p)
	assert.NilError(t, err)
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	assert.NilError(t, err)
	return n
}

// processAlive reports whether pid runs (a zombie does not).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// procReport describes pid for a failure message: its state, parent and,
// for a zombie, how it ended (the exit_code field of /proc/<pid>/stat:
// the low 7 bits are the killing signal, the next byte the exit status).
func procReport(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return fmt.Sprintf("pid %d gone (%v)", pid, err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return fmt.Sprintf("pid %d: unreadable stat %q", pid, s)
	}
	f := strings.Fields(s[i+2:]) // f[0] is field 3, the state
	rep := fmt.Sprintf("pid %d %s state %s ppid %s pgrp %s", pid, s[:i+1], f[0], f[1], f[2])
	if f[0] == "Z" && len(f) >= 50 {
		code, _ := strconv.Atoi(f[49]) // field 52
		rep += fmt.Sprintf(" exit_code %d (signal %d, status %d)", code, code&0x7f, code>>8&0xff)
	}
	return rep
}

// libkrunInstalled reports whether the loader could find libkrun here.
func libkrunInstalled() bool {
	for _, d := range []string{"/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/local/lib64", "/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"} {
		if _, err := os.Stat(filepath.Join(d, "libkrun.so.1")); err == nil {
			return true
		}
	}
	home, _ := os.UserHomeDir()
	_, err := os.Stat(filepath.Join(home, ".iii", "lib", "libkrun.so.1"))
	return err == nil
}

// dirLogs returns the logs a VM's state directory holds, for failures.
func dirLogs(dir string) string {
	var b strings.Builder
	for _, name := range []string{"runner.log", "qemu.stderr", "console.log"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		if len(data) > 4096 {
			data = data[len(data)-4096:]
		}
		b.WriteString("--- " + name + " ---\n" + string(data) + "\n")
	}
	return b.String()
}

// TestShutdownStopsEverything stops the adapter the way the engine does
// (go-plugin's Kill: a graceful shutdown, then a kill after two seconds):
// its VMs are stopped and their state directories removed.
func TestShutdownStopsEverything(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), nil)
	createN(t, p, 2)
	p.client.Kill()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		left, names := procsUnder(p.stateDir), sandboxDirs(t, p.stateDir)
		if len(left) > 0 || len(names) > 0 {
			return poll.Continue("processes %v, directories %v", left, names)
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Second), poll.WithDelay(20*time.Millisecond))
	assert.Check(t, strings.Contains(p.logs.String(), "stopped every sandbox for shutdown"), "the adapter did not shut down gracefully")
}

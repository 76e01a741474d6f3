package qemu

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
)

// TestTemplate records a template from a booted VM and restores two clones
// from it: both resume with the template's guest state, and what one
// clone writes the other never sees.
func TestTemplate(t *testing.T) {
	k := needVM(t)
	tpl := t.TempDir()
	mem := filepath.Join(tpl, "mem")
	state := filepath.Join(tpl, "state")

	// Record.
	b := boot(t, k, Config{RootDisk: k.rootImg, MemoryMiB: 256, MemoryFile: mem, MemoryShared: true, Control: true})
	res := run(t, b.client, agentclient.ExecRequest{Argv: []string{"sh", "-c", "echo template > /tmp/made-in-template"}})
	assert.Equal(t, res.ExitCode, 0)
	assert.NilError(t, b.client.Close())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	assert.NilError(t, SaveTemplate(ctx, filepath.Dir(b.vm.SocketPath), state))
	t.Logf("saved in %s", time.Since(t0))
	assert.NilError(t, Quit(ctx, filepath.Dir(b.vm.SocketPath)))
	assert.NilError(t, b.vm.Wait(ctx))
	st, err := os.Stat(state)
	assert.NilError(t, err)
	t.Logf("device state %d bytes", st.Size())

	restoreOne := func() *bootedVM {
		f, err := os.Open(state)
		assert.NilError(t, err)
		defer f.Close()
		t0 := time.Now()
		c := boot(t, k, Config{RootDisk: k.rootImg, MemoryMiB: 256, MemoryFile: mem, Control: true, Incoming: f})
		t.Logf("restored to hello in %s", time.Since(t0))
		return c
	}
	c1, c2 := restoreOne(), restoreOne()
	for _, c := range []*bootedVM{c1, c2} {
		res := run(t, c.client, agentclient.ExecRequest{Argv: []string{"cat", "/tmp/made-in-template", "/etc/marker"}})
		assert.Equal(t, string(res.Stdout), "template\n"+marker)
	}
	// Each clone maps the template's memory file privately (copy on
	// write): nothing of a clone's reaches the file or its siblings.
	for _, c := range []*bootedVM{c1, c2} {
		m := memMapping(t, c.vm.PID, mem)
		assert.Equal(t, m["perms"], "rw-p", "the memory file is not mapped private: %v", m)
		t.Logf("clone %d guest RAM: %v", c.vm.PID, m)
	}
	res = run(t, c1.client, agentclient.ExecRequest{Argv: []string{"sh", "-c", "echo one > /tmp/clone-one"}})
	assert.Equal(t, res.ExitCode, 0)
	res = run(t, c2.client, agentclient.ExecRequest{Argv: []string{"ls", "/tmp"}})
	assert.Equal(t, string(res.Stdout), "made-in-template\n")
}

// memMapping returns the permissions and the smaps counters (kB) of the
// mapping of file in process pid.
func memMapping(t *testing.T, pid int, file string) map[string]string {
	t.Helper()
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps")
	assert.NilError(t, err)
	defer f.Close()
	out := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 5 && strings.Contains(fields[0], "-") {
			in = len(fields) >= 6 && fields[5] == file
			if in {
				out["perms"] = fields[1]
			}
			continue
		}
		if in && len(fields) >= 2 {
			out[strings.TrimSuffix(fields[0], ":")] = fields[1]
		}
	}
	assert.Assert(t, out["perms"] != "", "no mapping of %s in pid %d", file, pid)
	return out
}

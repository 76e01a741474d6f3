package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

type reaperReport struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Reaped   int    `json:"reaped"`
	Zombies  int    `json:"zombies"`
	Err      string `json:"err,omitempty"`
}

// TestReaperCollectsOrphans runs the PID-1 reaper in a child process made a
// subreaper (so orphans are re-parented to it, as they are to init in the
// VM): an exec's own status is routed to it, and the orphan it left behind
// is reaped instead of staying a zombie.
func TestReaperCollectsOrphans(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GUEST_TEST_HELPER=reaper")
	out, err := cmd.CombinedOutput()
	assert.NilError(t, err, string(out))
	var rep reaperReport
	assert.NilError(t, json.Unmarshal(out, &rep), string(out))
	assert.Equal(t, rep.Err, "")
	assert.Equal(t, rep.ExitCode, 3)
	assert.Equal(t, rep.Stdout, "parent\n")
	assert.Assert(t, rep.Reaped >= 1, "orphans reaped: %d", rep.Reaped)
	assert.Equal(t, rep.Zombies, 0)
}

func reaperHelper() {
	rep := reaperReport{}
	defer func() {
		b, _ := json.Marshal(rep)
		fmt.Println(string(b))
	}()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		rep.Err = err.Error()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := NewReaper()
	go r.Run(ctx)
	e := &Executor{Waiter: r, DrainGrace: 50 * time.Millisecond}
	var stdout strings.Builder
	// The background sleep outlives its parent and becomes our orphan.
	st, err := e.Run(ctx, &agentproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 0.2 >/dev/null 2>&1 & echo parent; exit 3"}},
		ExecIO{Stdout: func(_ context.Context, p []byte) error { stdout.Write(p); return nil }})
	if err != nil {
		rep.Err = err.Error()
		return
	}
	rep.ExitCode, rep.Stdout = st.ExitCode, stdout.String()
	deadline := time.Now().Add(10 * time.Second)
	for r.Reaped() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	rep.Reaped = r.Reaped()
	rep.Zombies = countZombieChildren(os.Getpid())
}

func countZombieChildren(ppid int) int {
	des, _ := os.ReadDir("/proc")
	n := 0
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		if st, err := ReadProcStat(pid); err == nil && st.PPID == ppid && st.State == 'Z' {
			n++
		}
	}
	return n
}

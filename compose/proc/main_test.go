package proc

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain lets the test binary play the iii binary's helper roles: the
// reaper (`<exe> __compose-reaper ...`) and a stand-in Compose process that
// starts a reaper and a worker group and then waits to be killed.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ReaperCommand {
		os.Exit(ReaperMain(os.Stdin, os.Stdout, os.Stderr, os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "fake-compose" {
		os.Exit(fakeCompose(os.Args[2:]))
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fakeCompose starts a reaper and one worker group that ignores SIGTERM,
// tracks it, prints "<reaper pid> <worker pid>" and blocks until killed.
func fakeCompose(args []string) int {
	exe, err := os.Executable()
	if err != nil {
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := StartReaper(ctx, exe, 300*time.Millisecond)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	p, err := Start(Spec{Command: "trap '' TERM; sleep 300 & sleep 300; wait", Env: []string{"PATH=" + os.Getenv("PATH")}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := r.Track(p.Pid, p.Birth, PhaseWorker); err != nil {
		return 1
	}
	fmt.Printf("%d %d\n", r.Pid(), p.Pid)
	// Held until the test writes a line or closes stdin; which of the two
	// (and EOF is one) does not matter.
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

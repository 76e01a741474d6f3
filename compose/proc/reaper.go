package proc

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ReaperCommand is the hidden iii subcommand that runs the reaper.
const ReaperCommand = "__compose-reaper"

// Phases order the reaper's work when Compose dies: workers first, the
// managed engine last (it stops its sandbox adapters itself when its
// lifeline breaks, and needs the time to do so).
const (
	PhaseWorker = 0
	PhaseEngine = 1
)

// reaperReady is the reaper's first line on stdout: it runs and ignores
// terminal signals.
const reaperReady = "ready"

// Reaper is Compose's handle on its reaper process. Compose tells it every
// process group it starts; the pipe it writes to is the reaper's lifeline:
// when Compose dies (even by SIGKILL) the kernel closes it, the reaper
// reads EOF and kills every group it knows, then exits. A clean Compose
// shutdown says "exit" first, and the reaper leaves without killing.
type Reaper struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	w    io.WriteCloser
	done chan struct{}
}

// StartReaper runs `exe __compose-reaper --grace GRACE` in its own process
// group and waits for it to be ready.
func StartReaper(ctx context.Context, exe string, grace time.Duration) (*Reaper, error) {
	cmd := exec.Command(exe, ReaperCommand, "--grace", grace.String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = reaperEnv()
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the reaper (%s %s): %w", exe, ReaperCommand, err)
	}
	r := &Reaper{cmd: cmd, w: w, done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != reaperReady {
			err = fmt.Errorf("unexpected greeting %q", line)
		}
		ready <- err
		// Keep draining so a chatty reaper never blocks on a full pipe.
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() {
		_ = cmd.Wait()
		close(r.done)
	}()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = w.Close()
		_ = cmd.Process.Kill()
		<-r.done
		return nil, fmt.Errorf("start the reaper (%s %s): %w", exe, ReaperCommand, err)
	}
	return r, nil
}

// reaperEnv keeps only what the reaper needs: nothing from the project's
// secrets reaches it.
func reaperEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// Pid is the reaper's pid.
func (r *Reaper) Pid() int { return r.cmd.Process.Pid }

func (r *Reaper) send(line string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w == nil {
		return errors.New("the reaper is closed")
	}
	_, err := io.WriteString(r.w, line+"\n")
	return err
}

// Track tells the reaper about a process group (leader pid and its birth
// identity).
func (r *Reaper) Track(pgid int, birth string, phase int) error {
	if birth == "" {
		birth = "-"
	}
	return r.send(fmt.Sprintf("track %d %s %d", pgid, birth, phase))
}

// Untrack tells the reaper a group has been stopped.
func (r *Reaper) Untrack(pgid int) error {
	return r.send(fmt.Sprintf("untrack %d", pgid))
}

// Close ends the reaper without it killing anything: Compose has stopped
// its processes itself.
func (r *Reaper) Close(ctx context.Context) error {
	r.mu.Lock()
	w := r.w
	r.w = nil
	r.mu.Unlock()
	if w != nil {
		_, _ = io.WriteString(w, "exit\n")
		_ = w.Close()
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		_ = r.cmd.Process.Kill()
		<-r.done
		return ctx.Err()
	}
}

// Done is closed when the reaper process has exited.
func (r *Reaper) Done() <-chan struct{} { return r.done }

// reaperGroup is a group the reaper knows.
type reaperGroup struct {
	pgid  int
	birth string
	phase int
}

// ReaperMain is the reaper process: it reads commands from in until "exit"
// (returns 0, kills nothing) or EOF (Compose died: kill every known group,
// workers first, then return 0). It ignores terminal signals so a Ctrl-C
// aimed at Compose leaves it to Compose's orderly stop.
func ReaperMain(in io.Reader, out, errOut io.Writer, args []string) int {
	fs := flag.NewFlagSet(ReaperCommand, flag.ContinueOnError)
	fs.SetOutput(errOut)
	grace := fs.Duration("grace", 10*time.Second, "time each group gets between SIGTERM and SIGKILL")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	fmt.Fprintln(out, reaperReady)

	groups := map[int]reaperGroup{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		cmd, ok := parseReaperLine(sc.Text())
		if !ok {
			fmt.Fprintf(errOut, "reaper: ignoring %q\n", sc.Text())
			continue
		}
		switch cmd.op {
		case "exit":
			return 0
		case "track":
			groups[cmd.g.pgid] = cmd.g
		case "untrack":
			delete(groups, cmd.g.pgid)
		}
	}
	reap(groups, *grace, errOut)
	return 0
}

type reaperCmd struct {
	op string
	g  reaperGroup
}

// parseReaperLine decodes "track PGID BIRTH PHASE", "untrack PGID" or
// "exit".
func parseReaperLine(line string) (reaperCmd, bool) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return reaperCmd{}, false
	}
	pgid := func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n > 1
	}
	switch {
	case f[0] == "exit" && len(f) == 1:
		return reaperCmd{op: "exit"}, true
	case f[0] == "untrack" && len(f) == 2:
		n, ok := pgid(f[1])
		return reaperCmd{op: "untrack", g: reaperGroup{pgid: n}}, ok
	case f[0] == "track" && len(f) == 4:
		n, ok := pgid(f[1])
		phase, err := strconv.Atoi(f[3])
		if !ok || err != nil || (phase != PhaseWorker && phase != PhaseEngine) {
			return reaperCmd{}, false
		}
		birth := f[2]
		if birth == "-" {
			birth = ""
		}
		return reaperCmd{op: "track", g: reaperGroup{pgid: n, birth: birth, phase: phase}}, true
	}
	return reaperCmd{}, false
}

// reap kills the known groups: workers (SIGTERM, grace, SIGKILL), then the
// engine, which gets grace to stop by itself first because its own
// lifeline broke at the same moment.
func reap(groups map[int]reaperGroup, grace time.Duration, errOut io.Writer) {
	var workers, engines []*Process
	for _, g := range groups {
		p := Adopt(g.pgid, g.birth)
		if g.phase == PhaseEngine {
			engines = append(engines, p)
		} else {
			workers = append(workers, p)
		}
	}
	stopAll(workers, grace, errOut)
	if len(engines) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		for _, p := range engines {
			_ = p.waitGroupGone(ctx)
		}
		cancel()
		stopAll(engines, grace, errOut)
	}
}

func stopAll(ps []*Process, grace time.Duration, errOut io.Writer) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), grace+10*time.Second)
			defer cancel()
			if err := p.stop(ctx, grace); err != nil {
				fmt.Fprintf(errOut, "reaper: process group %d: %v\n", p.Pid, err)
			}
		}()
	}
	wg.Wait()
}

package nodesdk

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
)

// Script is a Node script that drives the SDK: it imports the SDK from
// III_SDK_URL, reads its job (JSON) from argv[2], prints one JSON object a
// line on stdout, and ends when its stdin closes.
type Script struct {
	// Path is the script file.
	Path string
	// RejectNonJSON fails the test on a stdout line that is not JSON
	// (scripts that promise JSON-only stdout); otherwise such lines are
	// skipped.
	RejectNonJSON bool
}

// Proc is a running Script.
type Proc struct {
	t     testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan map[string]any
	done  chan struct{}
	err   error
	// quit is closed by Stop: lines nobody will read are dropped, so the
	// reader cannot block on a full lines and hold up done.
	quit     chan struct{}
	quitOnce sync.Once
}

// killWait bounds the wait for a killed script's exit.
const killWait = 10 * time.Second

// Start runs script with job. When the test ends its stdin is closed (the
// script then shuts its SDK down) and it is waited for, killed after
// stopWait; its stderr is logged if the test failed.
func (s SDK) Start(t testing.TB, script Script, job any, stopWait time.Duration) *Proc {
	t.Helper()
	raw, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(s.Node, script.Path, string(raw))
	cmd.Env = append(os.Environ(), "III_SDK_URL="+s.URL)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Proc{t: t, cmd: cmd, stdin: stdin, lines: make(chan map[string]any, 100), done: make(chan struct{}), quit: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				if script.RejectNonJSON {
					t.Errorf("node printed a non-JSON line: %q", sc.Text())
				}
				continue
			}
			select {
			case p.lines <- m:
			case <-p.quit:
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop(stopWait)
		if t.Failed() {
			t.Logf("node stderr (%s):\n%s", raw, stderr.String())
		}
	})
	return p
}

// Stop closes the script's stdin, which shuts its SDK down, and waits for
// it to exit, killing it after wait.
func (p *Proc) Stop(wait time.Duration) {
	_ = p.stdin.Close()
	p.quitOnce.Do(func() { close(p.quit) })
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(killWait):
			// A child of node's holding its stdout keeps the reader going.
			p.t.Errorf("node (pid %d) killed after %s is still not done after another %s", p.cmd.Process.Pid, wait, killWait)
		}
	}
}

// Line returns the next line the script printed, failing the test if the
// script exits first or prints nothing for wait.
func (p *Proc) Line(t testing.TB, wait time.Duration) map[string]any {
	t.Helper()
	select {
	case m := <-p.lines:
		return m
	case <-p.done:
		select {
		case m := <-p.lines:
			return m
		default:
		}
		t.Fatalf("node exited before printing: %v", p.err)
	case <-time.After(wait):
		t.Fatal("node printed nothing")
	}
	return nil
}

// Done is closed when the script has exited (and its output is read).
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the script exited; read it after Done is closed.
func (p *Proc) Err() error { return p.err }

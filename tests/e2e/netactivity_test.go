package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/netns"
)

// Network payload keeps a sandbox alive (spec §7.3: the reaper counts
// relayed TCP data, UDP and DNS as activity). Two sandboxes with network
// and a short idle timeout: one keeps fetching from an HTTP server on a
// test host (a network namespace), from a process detached from any exec;
// the other does nothing. The idle one is reaped (S004 afterwards), the
// busy one outlives its idle timeout several times over although no
// operation touched it. Everything is real: engine, plugin host,
// sandbox-libkrun, the runner's user-mode network, the guest agent's
// counters.
func TestNetworkPayloadKeepsSandboxAlive(t *testing.T) {
	t.Parallel()
	s := needVMs(t)

	var hits atomic.Int64
	host := netns.Start(t)
	ln, _ := host.Listen(t, "tcp", 0)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "still here\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	eng := startPullingAdapter(t, s, "e2e-netact", map[string]any{"reaper_tick_ms": 1000})

	const idle = 15 * time.Second
	create := func() string {
		var out struct {
			SandboxID string `json:"sandbox_id"`
		}
		eng.call(t, "sandbox::create", map[string]any{"image": "python", "network": true,
			"idle_timeout_secs": int(idle / time.Second)}, &out)
		return out.SandboxID
	}
	// The quiet one first: under load a create can take longer than the
	// idle timeout, and the busy one must get its exec before it idles.
	quiet := create()
	busy := create()
	t.Cleanup(func() {
		eng.call(t, "sandbox::stop", map[string]any{"sandbox_id": busy, "wait": true}, nil)
	})

	// A daemon: the exec returns at once, its fetches go on with no
	// operation of the kit under way.
	// The image's Python is minimal (no http package): a raw GET.
	fetcher := fmt.Sprintf(`import os, socket, sys, time
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
while True:
    try:
        s = socket.create_connection((%[1]q, %[2]d), timeout=5)
        s.sendall(b"GET / HTTP/1.0\r\nHost: %[1]s\r\n\r\n")
        while s.recv(65536):
            pass
        s.close()
    except Exception:
        pass
    time.sleep(1)
`, host.Addr.String(), port)
	var out execReply
	eng.call(t, "sandbox::exec", map[string]any{"sandbox_id": busy, "argv": []string{"python3", "-c", fetcher}}, &out)
	checkRan(t, out, "")
	lastOp := time.Now()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if hits.Load() > 0 {
			return poll.Success()
		}
		return poll.Continue("the sandbox has not reached the host server yet")
	}, poll.WithTimeout(2*time.Minute), poll.WithDelay(200*time.Millisecond))

	type listed struct {
		Sandboxes []struct {
			ID      string `json:"sandbox_id"`
			Stopped bool   `json:"stopped"`
		} `json:"sandboxes"`
	}
	stopped := func(id string) bool {
		var l listed
		eng.call(t, "sandbox::list", map[string]any{}, &l)
		for _, sb := range l.Sandboxes {
			if sb.ID == id {
				return sb.Stopped
			}
		}
		return true // pruned: gone
	}

	// Until the busy sandbox has gone three idle timeouts without an
	// operation, it must stay, and the quiet one must be reaped.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if stopped(busy) {
			return poll.Error(fmt.Errorf("the fetching sandbox was reaped %s after its last operation (%d fetches)",
				time.Since(lastOp).Round(time.Second), hits.Load()))
		}
		if time.Since(lastOp) < 3*idle || !stopped(quiet) {
			return poll.Continue("waiting: %s since the last operation, quiet stopped: %t", time.Since(lastOp).Round(time.Second), stopped(quiet))
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Minute), poll.WithDelay(time.Second))

	w := eng.fail(t, "sandbox::exec", map[string]any{"sandbox_id": quiet, "argv": []string{"true"}},
		wantErr{code: "S004", typ: "validation", retryable: false})
	t.Log(w.Message)
	before := hits.Load()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if hits.Load() > before {
			return poll.Success()
		}
		return poll.Continue("the fetcher stopped")
	}, poll.WithTimeout(time.Minute), poll.WithDelay(200*time.Millisecond))
	out = execReply{}
	eng.call(t, "sandbox::exec", map[string]any{"sandbox_id": busy, "argv": []string{"echo", "alive"}}, &out)
	checkRan(t, out, "alive\n")
}

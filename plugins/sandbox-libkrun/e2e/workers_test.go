package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/enginetest"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/protocol"
)

// workerEnv is a real engine on a loopback WebSocket, with the plugin host
// running the sandbox-libkrun binary as a go-plugin subprocess, and a Go
// client that calls functions through the engine like Compose does.
type workerEnv struct {
	url   string
	cl    *client.Client
	host  *pluginhost.Host
	state string
	root  string
	logs  *syncbuf.Buffer
}

func newWorkerEnv(t *testing.T, e *env) *workerEnv {
	t.Helper()
	// The log is at debug level, so an adapter's raw stderr (a race report
	// under III_E2E_ADAPTER_RACE) is in the log the clean-up checks.
	env := enginetest.Start(t, enginetest.Options{ClientName: "compose-stand-in", CallTimeout: callTimeout, Wait: time.Minute})
	// The host roots: one directory holding the project. It and the state
	// directory are made before the plugin host, so they are removed after
	// it stopped the adapter (clean-ups run last in, first out).
	root, err := filepath.EvalSymlinks(t.TempDir())
	assert.NilError(t, err)
	state := dirs.Short(t, "sb")
	h, err := pluginhost.New(env.Engine, pluginhost.Options{Logger: env.Log.Named("plugin-host")})
	assert.NilError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.Check(t, h.Close(ctx))
		assert.Check(t, !strings.Contains(env.Logs.String(), "DATA RACE"), "the adapter reported a data race")
	})
	we := &workerEnv{url: env.URL, cl: env.Client, host: h, state: state, root: root, logs: env.Logs}
	cfg := map[string]any{
		"image_allowlist": []string{"node"},
		"state_dir":       we.state,
		"cache_dir":       e.cacheDir,
		"hypervisor":      "qemu",
		"accel":           "tcg",
		"host_roots":      []string{root},
		"worker_disk_mb":  512,
	}
	out, err := we.call(t, pluginhost.FnStart, map[string]any{"adapter": "sandbox-libkrun", "path": e.bin, "config": cfg})
	assert.NilError(t, err, "%s", out)
	return we
}

func (we *workerEnv) call(t *testing.T, fn string, payload any) (json.RawMessage, error) {
	t.Helper()
	return we.cl.Call(ctxT(t), fn, payload)
}

func (we *workerEnv) worker(t *testing.T, op string, payload, out any) {
	t.Helper()
	raw, err := we.call(t, "sandbox-libkrun::"+op, payload)
	assert.NilError(t, err, "%s %v", op, payload)
	if out != nil {
		assert.NilError(t, json.Unmarshal(raw, out), "%s", raw)
	}
}

// project lays out a Compose project whose VM worker is path://. : the
// worker's directory holds the compose file and Compose's state, the
// project token among it.
func (we *workerEnv) project(t *testing.T) (dir, token string) {
	t.Helper()
	dir = filepath.Join(we.root, "shop")
	var raw [16]byte
	_, err := rand.Read(raw[:])
	assert.NilError(t, err)
	token = "iii-project-token-" + hex.EncodeToString(raw[:])
	for name, content := range map[string]string{
		"worker-compose.yaml":                "containers:\n  vmtest:\n    worker: path://.\n",
		".iii/compose/default/project-token": token + "\n",
		"node_modules/host-only.txt":         "built for the host\n",
		"src/dist/built.js":                  "// build output\n",
		"src/app.js":                         "export const version = 1;\n",
		"iii.worker.yaml":                    "name: vmtest\nruntime:\n  kind: javascript\n  base_image: node\n",
	} {
		p := filepath.Join(dir, filepath.FromSlash(name))
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	b, err := os.ReadFile(filepath.Join("testdata", "vmworker", "worker.mjs"))
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(dir, "worker.mjs"), b, 0o644))
	// The copy into the VM leaves the top-level node_modules out (it is
	// not in include): the worker's install step lays the SDK out from a
	// pack.
	assert.NilError(t, nodesdk.WriteWorkerFiles(dir, nodesdk.FindModules(t)))
	return dir, token
}

// probe calls the worker's function through the engine until the worker
// has registered it.
func (we *workerEnv) probe(t *testing.T, input map[string]any) map[string]any {
	t.Helper()
	var out map[string]any
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		raw, err := we.cl.Call(ctx, "vmtest::probe", input)
		if err != nil {
			if client.CodeOf(err) == protocol.CodeFunctionNotFound {
				return poll.Continue("vmtest::probe is not registered yet")
			}
			return poll.Error(err)
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return poll.Error(err)
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Minute), poll.WithDelay(500*time.Millisecond))
	return out
}

// adapterPID waits until the plugin host runs sandbox-libkrun in a process
// other than old, and returns its pid.
func (we *workerEnv) adapterPID(t *testing.T, old int) int {
	t.Helper()
	var pid int
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		raw, err := we.call(t, pluginhost.FnList, nil)
		if err != nil {
			return poll.Error(err)
		}
		var l struct {
			Adapters []struct {
				Adapter string `json:"adapter"`
				State   string `json:"state"`
				PID     int    `json:"pid"`
			} `json:"adapters"`
		}
		if err := json.Unmarshal(raw, &l); err != nil {
			return poll.Error(err)
		}
		for _, a := range l.Adapters {
			if a.Adapter == "sandbox-libkrun" && a.State == string(pluginhost.StateRunning) && a.PID > 0 && a.PID != old {
				pid = a.PID
				return poll.Success()
			}
		}
		return poll.Continue("sandbox-libkrun is not running in a new process yet: %s", raw)
	}, poll.WithTimeout(3*time.Minute), poll.WithDelay(200*time.Millisecond))
	return pid
}

func (we *workerEnv) logText(t *testing.T, vmID string) string {
	t.Helper()
	var logs contract.WorkerLogsResponse
	we.worker(t, contract.OpWorkerLogs, map[string]any{"vm_id": vmID, "tail": 1000}, &logs)
	var b strings.Builder
	for _, e := range logs.Entries {
		b.WriteString(e.Stream + ": " + e.Message + "\n")
	}
	return b.String()
}

// TestVMWorkerNodeSDK boots a Node worker that uses the published iii-sdk
// in a VM: the project directory is copied in without the top-level
// node_modules or .iii (the project token never reaches the guest) but
// with a nested dist, the copy's log names what it left out, the install step
// runs once and its result survives a restart on the persistent disk, the
// worker reaches the engine on the host through the gateway and registers
// a function that a host caller invokes through the engine; logs, stop,
// an adapter restart and a kill -9 of the adapter (the next adapter
// process adopts the running VM and its command), S501 and remove.
func TestVMWorkerNodeSDK(t *testing.T) {
	e := needVMs(t)
	we := newWorkerEnv(t, e)
	dir, token := we.project(t)
	const vmID = "shop-3f2a1b9c-default-vmtest"
	port := we.url[strings.LastIndexByte(we.url, ':')+1:]
	start := map[string]any{
		"vm_id": vmID, "name": "vmtest", "namespace": "default", "image": "node",
		"host_dir": dir, "install": "node unpack.mjs", "command": "node worker.mjs",
		"env":        map[string]any{"III_WORKER_NAME": "vmtest", "MY_URL": "http://127.0.0.1:9/x"},
		"config":     map[string]any{"file_name": "vmtest.json", "content": `{"greeting":"hi"}`},
		"engine_url": "ws://127.0.0.1:" + port, "wait": true,
	}

	var started contract.WorkerStartResponse
	we.worker(t, contract.OpWorkerStart, start, &started)
	assert.Equal(t, started.State, contract.WorkerRunning, "%s", we.logText(t, vmID))
	assert.Assert(t, started.PID != nil && *started.PID > 0)

	got := we.probe(t, map[string]any{"n": 1})
	// The engine adds _caller_worker_id to worker-originated payloads.
	assert.Equal(t, got["echo"].(map[string]any)["n"], float64(1))
	assert.Equal(t, got["isolation"], "libkrun")
	assert.Equal(t, got["iii_url"], "ws://"+"10.0.2.2:"+port, "engine_url's loopback became the gateway")
	assert.Equal(t, got["my_url"], "http://10.0.2.2:9/x", "so did env values")
	assert.DeepEqual(t, got["config"], map[string]any{"greeting": "hi"})
	assert.Equal(t, got["cwd"], "/workspace")
	assert.Equal(t, got["src"], "export const version = 1;\n")
	assert.Equal(t, got["iii_dir"], false, ".iii is never copied into a VM")
	assert.Equal(t, got["token_file"], false)
	assert.Equal(t, got["engine_token_env"], nil)
	assert.Equal(t, got["top_node_modules_marker"], false, "node_modules is the guest's own")
	assert.Equal(t, got["nested_dist"], true, "dist is left out at the top only: src/dist arrives")

	var st contract.WorkerStatus
	we.worker(t, contract.OpWorkerStatus, map[string]any{"vm_id": vmID}, &st)
	assert.Equal(t, st.State, contract.WorkerRunning)
	assert.Equal(t, st.Restarts, uint64(0))
	assert.Equal(t, st.StateDir, filepath.Join(we.state, "workers", vmID))

	text := we.logText(t, vmID)
	assert.Check(t, is.Contains(text, "stdout: unpacked"), "install output is logged")
	assert.Check(t, is.Contains(text, "system: install: done"))
	assert.Check(t, is.Contains(text, "stdout: worker ready"))
	assert.Check(t, is.Contains(text, "node_modules/ (dependencies: the worker's install step makes them in the guest)"), "the copy names what it left out")
	assert.Check(t, is.Contains(text, "copy.include in iii.worker.yaml"))

	// A start that asks for what already runs changes nothing.
	var again contract.WorkerStartResponse
	we.worker(t, contract.OpWorkerStart, start, &again)
	assert.Equal(t, *again.PID, *started.PID)

	we.worker(t, contract.OpWorkerStop, map[string]any{"vm_id": vmID, "timeout_ms": 20000}, &st)
	assert.Equal(t, st.State, contract.WorkerStopped)
	assert.Check(t, is.Contains(we.logText(t, vmID), "stdout: worker got SIGTERM"), "stop is graceful")

	// The token is nowhere on the worker's persistent disk.
	disk := filepath.Join(st.StateDir, "disk.ext4")
	assert.Check(t, !fileHolds(t, disk, []byte(token)), "the project token reached the worker's disk")
	assert.Check(t, fileHolds(t, disk, []byte("iii-sdk")), "the scan sees what the guest wrote")

	// Started again: the install step's marker and result survived.
	we.worker(t, contract.OpWorkerStart, start, &started)
	assert.Equal(t, started.State, contract.WorkerRunning, "%s", we.logText(t, vmID))
	got = we.probe(t, map[string]any{"n": 2})
	assert.Equal(t, got["echo"].(map[string]any)["n"], float64(2))
	assert.Check(t, is.Contains(we.logText(t, vmID), "install: already done on this disk"))
	we.worker(t, contract.OpWorkerStatus, map[string]any{"vm_id": vmID}, &st)
	assert.Equal(t, st.Restarts, uint64(1))

	// Restarting the adapter (compose::restart worker=sandbox-libkrun, an
	// upgrade) leaves the worker VM running: the next adapter process
	// adopts it with its command, whose connection to the engine (through
	// the runner's gateway forward) never noticed.
	_, err := we.call(t, pluginhost.FnRestart, map[string]any{"adapter": "sandbox-libkrun"})
	assert.NilError(t, err)
	adopted := func(what string, n int) {
		t.Helper()
		we.worker(t, contract.OpWorkerStatus, map[string]any{"vm_id": vmID}, &st)
		assert.Equal(t, st.State, contract.WorkerRunning, "%s: %s", what, we.logText(t, vmID))
		assert.Equal(t, *st.PID, *started.PID, "%s: the same command", what)
		assert.Equal(t, st.Restarts, uint64(1), "%s: not restarted", what)
		got := we.probe(t, map[string]any{"n": n})
		assert.Equal(t, got["echo"].(map[string]any)["n"], float64(n), what)
		assert.Check(t, is.Contains(we.logText(t, vmID), "adopted by a new adapter process"), what)
	}
	adopted("after an adapter restart", 3)

	// kill -9 of the adapter: the plugin host starts it again, and that
	// process adopts the VM too.
	apid := we.adapterPID(t, 0)
	assert.NilError(t, unix.Kill(apid, unix.SIGKILL))
	we.adapterPID(t, apid)
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		raw, err := we.call(t, "sandbox-libkrun::"+contract.OpWorkerStatus, map[string]any{"vm_id": vmID})
		if err != nil {
			return poll.Continue("the new adapter does not answer yet: %v", err)
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return poll.Error(err)
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Minute), poll.WithDelay(200*time.Millisecond))
	adopted("after kill -9 of the adapter", 4)

	// Stopped now, it keeps its state.
	we.worker(t, contract.OpWorkerStop, map[string]any{"vm_id": vmID, "timeout_ms": 20000}, &st)
	assert.Equal(t, st.State, contract.WorkerStopped)
	assert.Check(t, fileExists(disk), "the persistent disk stays")
	var list contract.WorkerListResponse
	we.worker(t, contract.OpWorkerList, nil, &list)
	assert.Equal(t, len(list.Workers), 1)
	assert.Equal(t, list.Workers[0].VMID, vmID)

	// A directory outside the host roots is refused.
	outside := t.TempDir()
	bad := map[string]any{}
	for k, v := range start {
		bad[k] = v
	}
	bad["vm_id"], bad["host_dir"] = "other", outside
	_, err = we.call(t, "sandbox-libkrun::"+contract.OpWorkerStart, bad)
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "%v", err)
	se, ok := contract.FromErrorBody(eb)
	assert.Assert(t, ok)
	assert.Equal(t, se.Code, contract.S501)
	assert.Check(t, is.Contains(se.Message, "compose::restart worker=sandbox-libkrun"))

	var rm contract.WorkerRemoveResponse
	we.worker(t, contract.OpWorkerRemove, map[string]any{"vm_id": vmID}, &rm)
	assert.Check(t, rm.Removed)
	_, err = os.Stat(rm.StateDir)
	assert.Check(t, errors.Is(err, fs.ErrNotExist), "the state directory is gone")
	_, err = we.call(t, "sandbox-libkrun::"+contract.OpWorkerStatus, map[string]any{"vm_id": vmID})
	assert.Assert(t, errors.As(err, &eb))
	se, _ = contract.FromErrorBody(eb)
	assert.Equal(t, se.Code, contract.S002)
}

// TestVMWorkerFailsVisibly: a command that exits with an error is failed
// with its status and output in the log; a failing install is failed
// before the command runs.
func TestVMWorkerFailsVisibly(t *testing.T) {
	e := needVMs(t)
	we := newWorkerEnv(t, e)
	dir := filepath.Join(we.root, "broken")
	assert.NilError(t, os.MkdirAll(dir, 0o755))
	start := map[string]any{
		"vm_id": "broken", "name": "broken", "image": "node", "host_dir": dir,
		"command": "echo about to fail; echo oops >&2; exit 3", "engine_url": "ws://127.0.0.1:1", "wait": true,
	}
	we.worker(t, contract.OpWorkerStart, start, nil)
	var st contract.WorkerStatus
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		we.worker(t, contract.OpWorkerStatus, map[string]any{"vm_id": "broken"}, &st)
		if st.State == contract.WorkerRunning {
			return poll.Continue("still running")
		}
		return poll.Success()
	}, poll.WithTimeout(2*time.Minute), poll.WithDelay(200*time.Millisecond))
	assert.Equal(t, st.State, contract.WorkerFailed)
	assert.Equal(t, *st.ExitCode, 3)
	assert.Check(t, is.Contains(st.LastError, "exited with status 3"))
	text := we.logText(t, "broken")
	assert.Check(t, is.Contains(text, "stdout: about to fail"))
	assert.Check(t, is.Contains(text, "stderr: oops"))

	start["install"] = "echo cannot install >&2; exit 7"
	_, err := we.call(t, "sandbox-libkrun::"+contract.OpWorkerStart, start)
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "%v", err)
	se, _ := contract.FromErrorBody(eb)
	assert.Equal(t, se.Code, contract.S300)
	assert.Check(t, is.Contains(se.Message, "exited with status 7"))
	we.worker(t, contract.OpWorkerStatus, map[string]any{"vm_id": "broken"}, &st)
	assert.Equal(t, st.State, contract.WorkerFailed)
	assert.Check(t, is.Contains(we.logText(t, "broken"), "stderr: cannot install"))
}

// fileHolds reports whether the file at p holds needle, reading only its
// data extents (the disk is a sparse file much larger than its data).
func fileHolds(t *testing.T, p string, needle []byte) bool {
	t.Helper()
	f, err := os.Open(p)
	assert.NilError(t, err)
	defer f.Close()
	fi, err := f.Stat()
	assert.NilError(t, err)
	fd := int(f.Fd())
	var off int64
	for off < fi.Size() {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			break // no data after off
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		assert.NilError(t, err)
		// Overlap chunks by the needle's length so a match across two
		// reads is seen.
		start := max(data-int64(len(needle)), 0)
		r := io.NewSectionReader(f, start, hole-start)
		buf := make([]byte, 4<<20)
		var carry []byte
		for {
			n, rerr := r.Read(buf)
			chunk := append(carry, buf[:n]...)
			if bytes.Contains(chunk, needle) {
				return true
			}
			if len(chunk) > len(needle) {
				carry = append([]byte{}, chunk[len(chunk)-len(needle):]...)
			}
			if rerr != nil {
				break
			}
		}
		off = hole
	}
	return false
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

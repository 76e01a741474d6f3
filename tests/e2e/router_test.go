package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/internal/testkit/netns"
	"github.com/iii-sandbox/iii/internal/testkit/syncbuf"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/registrytest"
	"github.com/iii-sandbox/iii/protocol"
)

// pushedImage is a preset as the test registry serves it.
type pushedImage struct {
	ref    string   // canonical reference, as the cache records it
	digest string   // manifest digest
	layers []string // layer digests
}

// execReply is sandbox::exec's and sandbox::run's reply (contract 1.1).
type execReply struct {
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	ExitCode        *int    `json:"exit_code"`
	TimedOut        bool    `json:"timed_out"`
	Success         bool    `json:"success"`
	StdoutTruncated *bool   `json:"stdout_truncated"`
	StderrTruncated *bool   `json:"stderr_truncated"`
	SandboxID       *string `json:"sandbox_id"`
}

// checkRan checks a finished program's reply: exit 0 and stdout.
func checkRan(t *testing.T, out execReply, stdout string) {
	t.Helper()
	assert.Check(t, is.Equal(out.Stdout, stdout), "stderr: %s", out.Stderr)
	assert.Check(t, out.Success && !out.TimedOut, "stderr: %s", out.Stderr)
	assert.Check(t, out.ExitCode != nil && *out.ExitCode == 0)
	assert.Check(t, out.StdoutTruncated != nil && !*out.StdoutTruncated, "stdout_truncated must be present and false")
	assert.Check(t, out.StderrTruncated != nil && !*out.StderrTruncated, "stderr_truncated must be present and false")
}

// TestThroughRouter drives sandbox::* through one engine assembled from a
// config.yaml whose sandbox: section binds sandbox-libkrun in default. The
// adapter is the real plugin subprocess, started with
// engine::adapters::start; its image cache starts empty and its registry
// mirror for docker.io is an in-process OCI registry seeded with the
// Debian-built presets, so every image is pulled through the registry
// protocol by auto_install, in this test. The caller is the Go client over
// a WebSocket (and, in one subtest, the published Node SDK).
//
// The first steps run in order because each changes the adapter or its
// cache (air-gapped S101, then a registry fault and S102, then the retry
// that installs python); the rest share the engine, the adapter and one
// sandbox, and run in parallel.
func TestThroughRouter(t *testing.T) {
	t.Parallel()
	s := needVMs(t)
	ctx := ctxT(t)

	tap := newRegistryTap()
	reg, err := registrytest.Start(registrytest.Options{Hook: tap.hook})
	assert.NilError(t, err)
	t.Cleanup(reg.Close)
	images := map[string]pushedImage{}
	for name, ref := range map[string]string{"python": pythonRef, "node": nodeRef} {
		_, err := reg.PushLayout(ctx, s.layout, ref)
		assert.NilError(t, err)
		e, err := ocilayout.Find(s.layout, ref)
		assert.NilError(t, err)
		assert.Assert(t, e != nil && e.Image != nil, "%s is a single-platform image in the layout", ref)
		im := pushedImage{ref: ref, digest: e.Descriptor.Digest.String()}
		layers, err := e.Image.Layers()
		assert.NilError(t, err)
		for _, l := range layers {
			d, err := l.Digest()
			assert.NilError(t, err)
			im.layers = append(im.layers, d.String())
		}
		images[name] = im
	}
	reg.ResetRequests()

	state := dirs.Short(t, "e2e")
	cache := t.TempDir()
	// Registered before the engine starts, so it runs after the engine
	// (and with it the adapter) has stopped: no adapter, runner or QEMU
	// outlives it.
	adapterPID := 0
	t.Cleanup(func() {
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			if left := procsMarked(state); len(left) > 0 {
				return poll.Continue("processes outlive the engine: %v", left)
			}
			if adapterPID > 0 && runs(adapterPID, s.adapterBin) {
				return poll.Continue("the adapter (pid %d) outlives the engine", adapterPID)
			}
			return poll.Success()
		}, poll.WithTimeout(30*time.Second), poll.WithDelay(100*time.Millisecond))
	})
	eng := startEngine(t, t.TempDir(), "sandbox:\n  adapter: sandbox-libkrun\n  namespace: default\n")

	config := func(autoInstall bool) map[string]any {
		return map[string]any{
			"image_allowlist":  []string{"python", "node"},
			"auto_install":     autoInstall,
			"state_dir":        state,
			"cache_dir":        cache,
			"registry_mirrors": map[string]string{"docker.io": reg.URL()},
			// Several TCG boots at once on a loaded two-core host.
			"boot_timeout_ms": 180_000,
			// Nothing may outlive the engine (the clean-up above).
			"adopt_grace_ms": 0,
		}
	}
	type adapterStatus struct {
		State     string `json:"state"`
		LastError string `json:"last_error"`
	}
	var st adapterStatus
	eng.call(t, "engine::adapters::start", map[string]any{"adapter": "sandbox-libkrun", "namespace": "default",
		"path": s.adapterBin, "config": config(false)}, &st)
	assert.Equal(t, st.State, "running", "last error: %s", st.LastError)

	if !t.Run("S101 air-gapped with an empty cache", func(t *testing.T) {
		w := eng.fail(t, "sandbox::create", map[string]any{"image": "python"},
			wantErr{code: "S101", typ: "internal", retryable: false})
		t.Log(w.Message)
		for _, kind := range []string{"manifest GET", "manifest HEAD", "blob GET"} {
			assert.Check(t, is.Equal(reg.Requests(kind), 0), "an air-gapped adapter asked the registry (%s)", kind)
		}
		py := images["python"]
		checkCache(t, cache, py.ref, py.digest, py.layers, false)
	}) {
		t.FailNow()
	}

	eng.call(t, "engine::adapters::restart", map[string]any{"adapter": "sandbox-libkrun", "namespace": "default",
		"config": config(true)}, &st)
	assert.Equal(t, st.State, "running", "last error: %s", st.LastError)

	// sandbox is the python sandbox the S102 retry creates; the parallel
	// fs subtests share it.
	var sandbox string
	if !t.Run("S102 registry fault then retry", func(t *testing.T) {
		py := images["python"]
		tap.setFault(py.layers[0])
		w := eng.fail(t, "sandbox::create", map[string]any{"image": "python"},
			wantErr{code: "S102", typ: "transient", retryable: true})
		t.Log(w.Message)
		_, failed := tap.counts(py.layers[0])
		assert.Check(t, failed > 0, "the fault never fired")
		checkCache(t, cache, py.ref, py.digest, py.layers, false)

		tap.setFault("")
		var out struct {
			SandboxID string `json:"sandbox_id"`
			Image     string `json:"image"`
		}
		// The parallel subtests run two at a time; on a loaded machine the
		// last of them start minutes later, past the default five idle
		// minutes, and the reaper must not take the sandbox they share.
		eng.call(t, "sandbox::create", map[string]any{"image": "python", "idle_timeout_secs": 3600}, &out)
		assert.Assert(t, out.SandboxID != "")
		assert.Check(t, is.Equal(out.Image, "python"))
		sandbox = out.SandboxID
		served, _ := tap.counts(py.layers[0])
		assert.Check(t, served > 0, "the layer was never downloaded from the registry")
		checkCache(t, cache, py.ref, py.digest, py.layers, true)
	}) {
		t.FailNow()
	}
	_, err = os.Stat(filepath.Join(cache, "oci"))
	assert.Check(t, errors.Is(err, os.ErrNotExist), "the adapter's cache has a local OCI layout: images did not come from the registry")

	t.Run("shared", func(t *testing.T) {
		t.Run("run node", func(t *testing.T) {
			t.Parallel()
			var out execReply
			eng.call(t, "sandbox::run", map[string]any{"image": "node", "lang": "node", "code": "console.log(6*7)"}, &out)
			checkRan(t, out, "42\n")
			assert.Check(t, out.SandboxID == nil, "sandbox_id is only for keep_sandbox")
			node := images["node"]
			served, _ := tap.counts(node.layers[0])
			assert.Check(t, served > 0, "node was not pulled from the registry")
			checkCache(t, cache, node.ref, node.digest, node.layers, true)
		})
		t.Run("run python", func(t *testing.T) {
			t.Parallel()
			var out execReply
			eng.call(t, "sandbox::run", map[string]any{"image": "python", "lang": "python",
				"code": "import platform, sys\nprint(platform.python_implementation(), sys.version_info[0], 6*7)"}, &out)
			checkRan(t, out, "CPython 3 42\n")
		})
		t.Run("fs stream 100 MiB", func(t *testing.T) {
			t.Parallel()
			testStream(t, eng, sandbox)
		})
		t.Run("fs errors", func(t *testing.T) {
			t.Parallel()
			testFSErrors(t, eng, sandbox)
		})
		t.Run("network", func(t *testing.T) {
			t.Parallel()
			testNetwork(t, eng)
		})
		t.Run("node sdk caller", func(t *testing.T) {
			t.Parallel()
			testNodeCaller(t, s, eng)
		})
	})

	// The shared sandbox is left running: stopping the engine must take
	// its VM, its runner and the adapter down (checked by the cleanup
	// above). The scan sees them now, so its later silence means something.
	var list struct {
		Sandboxes []struct {
			ID      string `json:"sandbox_id"`
			Stopped bool   `json:"stopped"`
		} `json:"sandboxes"`
	}
	eng.call(t, "sandbox::list", map[string]any{}, &list)
	var live []string
	for _, sb := range list.Sandboxes {
		if !sb.Stopped {
			live = append(live, sb.ID)
		}
	}
	assert.Check(t, is.DeepEqual(live, []string{sandbox}))
	assertRunning(t, procsMarked(state), "__vm-run", "qemu-system")
	var adapters struct {
		Adapters []struct {
			PID int `json:"pid"`
		} `json:"adapters"`
	}
	eng.call(t, "engine::adapters::list", nil, &adapters)
	assert.Assert(t, is.Len(adapters.Adapters, 1))
	adapterPID = adapters.Adapters[0].PID
	assert.Check(t, runs(adapterPID, s.adapterBin), "engine::adapters::list names pid %d, which does not run the adapter", adapterPID)
}

// fileSize is the size of the streamed file: large enough that neither the
// engine, the plugin host nor the adapter can hold it in one message.
const fileSize = 100 << 20

// testStream writes a 100 MiB file through a channel with fs::write and
// reads it back through fs::read's channel.
func testStream(t *testing.T, eng *engineFixture, sandbox string) {
	ctx := ctxT(t)
	const path = "/root/stream/big.bin"
	wref, rref, err := eng.cl.CreateChannel(ctx, 0)
	assert.NilError(t, err)
	w, err := eng.cl.OpenChannelWriter(ctx, wref)
	assert.NilError(t, err)
	sent := sha256.New()
	wrote := make(chan error, 1)
	go func() {
		src := rand.NewChaCha8([32]byte{'e', '2', 'e'})
		buf := make([]byte, 1<<20)
		for n := 0; n < fileSize; n += len(buf) {
			_, _ = src.Read(buf)
			sent.Write(buf)
			if _, err := w.Write(buf); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- w.Close()
	}()
	var res struct {
		BytesWritten int64  `json:"bytes_written"`
		Path         string `json:"path"`
	}
	raw, err := eng.cl.Call(ctx, "sandbox::fs::write", map[string]any{"sandbox_id": sandbox, "path": path,
		"parents": true, "content": rref}, client.WithTimeout(callTimeout))
	if err != nil {
		_ = w.Close() // unblocks the writer
		waitfor.Recv(t, wrote, waitfor.Default, "the channel writer to end once closed")
		t.Fatalf("fs::write through a channel: %v", err)
	}
	assert.NilError(t, waitfor.Recv(t, wrote, callTimeout, "the channel writer to finish"))
	assert.NilError(t, json.Unmarshal(raw, &res))
	assert.Check(t, is.Equal(res.BytesWritten, int64(fileSize)))
	assert.Check(t, is.Equal(res.Path, path))

	var rd struct {
		Content protocol.StreamChannelRef `json:"content"`
		Body    *string                   `json:"body"`
		Size    int64                     `json:"size"`
		Mode    string                    `json:"mode"`
	}
	eng.call(t, "sandbox::fs::read", map[string]any{"sandbox_id": sandbox, "path": path}, &rd)
	assert.Check(t, is.Equal(rd.Size, int64(fileSize)))
	assert.Check(t, rd.Body == nil, "a 100 MiB file has no inline body")
	assert.Check(t, is.Equal(rd.Mode, "0644"))
	r, err := eng.cl.OpenChannelReader(ctx, rd.Content)
	assert.NilError(t, err)
	got := sha256.New()
	n, err := io.Copy(got, r)
	_ = r.Close()
	assert.NilError(t, err)
	assert.Check(t, is.Equal(n, int64(fileSize)))
	assert.Check(t, is.Equal(fmt.Sprintf("%x", got.Sum(nil)), fmt.Sprintf("%x", sent.Sum(nil))), "the file read back differs")
	eng.call(t, "sandbox::fs::rm", map[string]any{"sandbox_id": sandbox, "path": "/root/stream", "recursive": true}, nil)

	// A small file: the reply carries it inline as body when it is valid
	// UTF-8, and the channel carries it either way.
	for _, tc := range []struct {
		name    string
		content map[string]any
		data    []byte
		body    bool
	}{
		{"utf-8", map[string]any{"content": "héllo wörld ✓\n"}, []byte("héllo wörld ✓\n"), true},
		{"binary", map[string]any{"content_b64": base64.StdEncoding.EncodeToString([]byte{0xff, 0xfe, 0, 1})}, []byte{0xff, 0xfe, 0, 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := "/root/small-" + tc.name
			req := map[string]any{"sandbox_id": sandbox, "path": p}
			for k, v := range tc.content {
				req[k] = v
			}
			eng.call(t, "sandbox::fs::write", req, nil)
			var rd struct {
				Content protocol.StreamChannelRef `json:"content"`
				Body    *string                   `json:"body"`
				Size    int64                     `json:"size"`
			}
			eng.call(t, "sandbox::fs::read", map[string]any{"sandbox_id": sandbox, "path": p}, &rd)
			assert.Check(t, is.Equal(rd.Size, int64(len(tc.data))))
			if tc.body {
				assert.Assert(t, rd.Body != nil, "a small UTF-8 file carries body")
				assert.Check(t, is.Equal(*rd.Body, string(tc.data)))
			} else {
				assert.Check(t, rd.Body == nil, "a file that is not UTF-8 has no body")
			}
			r, err := eng.cl.OpenChannelReader(ctx, rd.Content)
			assert.NilError(t, err)
			data, err := io.ReadAll(r)
			_ = r.Close()
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(data, tc.data))
		})
	}
}

// testFSErrors produces every filesystem error code S210–S217 through the
// router and checks each one's wire shape.
func testFSErrors(t *testing.T, eng *engineFixture, sandbox string) {
	req := func(kv ...any) map[string]any {
		m := map[string]any{"sandbox_id": sandbox}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	// A directory that is not empty, for S214.
	eng.call(t, "sandbox::fs::write", req("path", "/root/errs/full/f.txt", "content", "x", "parents", true), nil)
	fs := func(code string) wantErr { return wantErr{code: code, typ: "filesystem"} }
	for _, tc := range []struct {
		name string
		fn   string
		req  map[string]any
		want wantErr
	}{
		{"S210 content and content_b64", "sandbox::fs::write", req("path", "/root/errs/x", "content", "a", "content_b64", "YQ=="), fs("S210")},
		{"S210 sed with files and path", "sandbox::fs::sed", req("files", []string{"/root/errs/full/f.txt"}, "path", "/root/errs",
			"pattern", "x", "replacement", "y"), fs("S210")},
		{"S211 missing file", "sandbox::fs::read", req("path", "/root/errs/missing"), fs("S211")},
		{"S212 ls of a file", "sandbox::fs::ls", req("path", "/etc/passwd"), fs("S212")},
		{"S213 mkdir of an existing directory", "sandbox::fs::mkdir", req("path", "/root/errs/full"), fs("S213")},
		{"S214 rm of a directory that is not empty", "sandbox::fs::rm", req("path", "/root/errs/full"), fs("S214")},
		{"S215 rm of a proc file", "sandbox::fs::rm", req("path", "/proc/version"), fs("S215")},
		{"S216 name too long", "sandbox::fs::stat", req("path", "/root/"+strings.Repeat("n", 300)), fs("S216")},
		{"S217 invalid regex", "sandbox::fs::grep", req("path", "/root/errs", "pattern", "(unclosed"), fs("S217")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := eng.fail(t, tc.fn, tc.req, tc.want)
			t.Log(w.Message)
		})
	}

	// A missing parent: S211 with fix {parents: true}; the request with the
	// fix merged in succeeds.
	for _, tc := range []struct {
		fn  string
		req map[string]any
	}{
		{"sandbox::fs::write", req("path", "/root/errs/a/b/c.txt", "content", "fixed\n")},
		{"sandbox::fs::mkdir", req("path", "/root/errs/m/n/o")},
	} {
		t.Run("S211 parent missing "+tc.fn, func(t *testing.T) {
			w := eng.fail(t, tc.fn, tc.req, wantErr{code: "S211", typ: "filesystem", fix: map[string]any{"parents": true}})
			merged := map[string]any{}
			for k, v := range tc.req {
				merged[k] = v
			}
			for k, v := range w.Fix {
				merged[k] = v
			}
			eng.call(t, tc.fn, merged, nil)
			var st struct {
				Name  string `json:"name"`
				IsDir bool   `json:"is_dir"`
			}
			eng.call(t, "sandbox::fs::stat", req("path", tc.req["path"]), &st)
			assert.Check(t, is.Equal(st.Name, filepath.Base(tc.req["path"].(string))))
			assert.Check(t, is.Equal(st.IsDir, tc.fn == "sandbox::fs::mkdir"))
		})
	}
}

// testNetwork fetches from an HTTP server on a test host (a network
// namespace; the guest's network reaches no address of this host), which
// only a sandbox created with network: true can reach. The images carry
// python3-minimal, which has no http package: the script speaks HTTP/1.0
// over a socket.
func testNetwork(t *testing.T, eng *engineFixture) {
	token := fmt.Sprintf("hello-from-the-test-host-%d", time.Now().UnixNano())
	var hits atomic.Int32
	host := netns.Start(t)
	ln, _ := host.Listen(t, "tcp", 0)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, token)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	script := fmt.Sprintf(`import socket
s = socket.create_connection((%[1]q, %[2]d), timeout=20)
s.sendall(b"GET / HTTP/1.0\r\nHost: %[1]s\r\n\r\n")
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
head, body = data.split(b"\r\n\r\n", 1)
assert head.startswith(b"HTTP/1.0 200"), head
print(body.decode())
`, host.Addr.String(), port)

	create := func(network bool) string {
		var out struct {
			SandboxID string `json:"sandbox_id"`
		}
		eng.call(t, "sandbox::create", map[string]any{"image": "python", "network": network}, &out)
		t.Cleanup(func() {
			var st struct {
				Stopped bool `json:"stopped"`
			}
			eng.call(t, "sandbox::stop", map[string]any{"sandbox_id": out.SandboxID, "wait": true}, &st)
			assert.Check(t, st.Stopped)
		})
		return out.SandboxID
	}
	online, offline := create(true), create(false)
	var out execReply
	eng.call(t, "sandbox::exec", map[string]any{"sandbox_id": online, "argv": []string{"python3", "-c", script}}, &out)
	checkRan(t, out, token+"\n")
	assert.Check(t, is.Equal(hits.Load(), int32(1)))

	out = execReply{}
	eng.call(t, "sandbox::exec", map[string]any{"sandbox_id": offline, "argv": []string{"python3", "-c", script}}, &out)
	assert.Check(t, !out.Success, "a sandbox without network reached the host: %q", out.Stdout)
	assert.Check(t, is.Contains(out.Stderr, "OSError"))
	assert.Check(t, is.Equal(hits.Load(), int32(1)), "the server was reached from a sandbox without network")
}

// testNodeCaller runs sandbox::run from the published Node SDK.
func testNodeCaller(t *testing.T, s *suite, eng *engineFixture) {
	if s.nodeSkip != "" {
		t.Skip(s.nodeSkip)
	}
	job, err := json.Marshal(map[string]any{
		"url": eng.url, "name": "e2e-node-caller", "timeout_ms": callTimeout.Milliseconds(),
		"calls": []map[string]any{{"function_id": "sandbox::run",
			"payload": map[string]any{"image": "python", "lang": "python", "code": "print(2+2)"}}},
	})
	assert.NilError(t, err)
	ctx := ctxT(t)
	cmd := exec.CommandContext(ctx, s.node, filepath.Join("testdata", "node", "caller.mjs"), string(job))
	cmd.Env = append(os.Environ(), "III_SDK_URL="+s.sdkURL)
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	assert.NilError(t, err, "node stderr:\n%s", stderr.Tail(50))
	sc := bufio.NewScanner(strings.NewReader(string(stdout)))
	var lines []map[string]any
	for sc.Scan() {
		var m map[string]any
		assert.NilError(t, json.Unmarshal(sc.Bytes(), &m), "node printed %q", sc.Text())
		lines = append(lines, m)
	}
	assert.Assert(t, is.Len(lines, 1), "node stderr:\n%s", stderr.Tail(50))
	assert.Assert(t, lines[0]["ok"] == true, "the Node SDK call failed: %v", lines[0])
	res := lines[0]["result"].(map[string]any)
	assert.Check(t, is.Equal(res["stdout"], "4\n"))
	assert.Check(t, is.Equal(res["success"], true))
}

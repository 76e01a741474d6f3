package pluginhost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/protocol"
)

// waitFor bounds waits in these tests; it is a hang guard, not a timing
// assertion.
const waitFor = 30 * time.Second

// testEnv is a real engine on a loopback WebSocket server with the plugin
// host attached, and a Go client connected to it as a worker.
type testEnv struct {
	eng  *engine.Engine
	url  string
	host *Host
	cl   *client.Client
	logs *syncBuffer
}

type syncBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.String()
}

// isolatedFinder finds nothing by discovery: tests give explicit paths,
// or set up their own directories.
func isolatedFinder(t testing.TB) Finder {
	home := t.TempDir()
	return Finder{
		Getenv:     func(string) string { return "" },
		HomeDir:    func() (string, error) { return home, nil },
		Executable: func() (string, error) { return filepath.Join(home, "bin", "iii"), nil },
	}
}

func newEnv(t testing.TB, opts Options) *testEnv {
	t.Helper()
	logs := newSyncBuffer()
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})
	eng := engine.New(engine.Options{Logger: log.Named("engine")})
	srv := httptest.NewServer(eng.Handler())
	if opts.Logger == nil {
		opts.Logger = log.Named("plugin-host")
	}
	if opts.Finder.Getenv == nil {
		opts.Finder = isolatedFinder(t)
	}
	h, err := New(eng, opts)
	assert.NilError(t, err)
	url := "ws" + strings.TrimPrefix(srv.URL, "http")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cl, err := client.Dial(ctx, url, client.Options{Name: "test-caller", IgnoreEnv: true,
		Reconnect: client.ReconnectPolicy{Disable: true}, CallTimeout: waitFor})
	assert.NilError(t, err)
	te := &testEnv{eng: eng, url: url, host: h, cl: cl, logs: logs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		assert.Check(t, h.Close(ctx))
		assert.Check(t, cl.Close(ctx))
		assert.Check(t, eng.Close(ctx))
		srv.Close()
		assert.Check(t, len(adapterProcesses(testBinDir)) == 0, "no adapter process outlives Close")
		if t.Failed() {
			t.Logf("engine log:\n%s", logs.String())
		}
	})
	return te
}

// hostdirConfig is a working configuration of the hostdir example adapter.
func hostdirConfig(t testing.TB, extra map[string]any) map[string]any {
	cfg := map[string]any{
		"image_allowlist":                 []string{"python", "shell"},
		"state_dir":                       t.TempDir(),
		"max_concurrent_exec_per_sandbox": 64,
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return cfg
}

func (te *testEnv) call(t testing.TB, fn string, payload any, opts ...client.CallOption) (json.RawMessage, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	return te.cl.Call(ctx, fn, payload, opts...)
}

func (te *testEnv) mustCall(t *testing.T, fn string, payload any, opts ...client.CallOption) map[string]any {
	t.Helper()
	out, err := te.call(t, fn, payload, opts...)
	assert.NilError(t, err, "call %s", fn)
	var m map[string]any
	assert.NilError(t, json.Unmarshal(out, &m))
	return m
}

// sandboxErr is the S-code error of a failed sandbox call.
func sandboxErr(t *testing.T, err error) *contract.Error {
	t.Helper()
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "a remote error, got %v", err)
	se, ok := contract.FromErrorBody(eb)
	assert.Assert(t, ok, "the message carries a sandbox error: %q", eb.Message)
	assert.Equal(t, string(se.Code), eb.Code, "the error code is the S-code")
	return se
}

func codeOf(err error) string { return client.CodeOf(err) }

func (te *testEnv) start(t testing.TB, in map[string]any) (map[string]any, error) {
	t.Helper()
	out, err := te.call(t, FnStart, in)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	assert.NilError(t, json.Unmarshal(out, &m))
	return m, nil
}

func (te *testEnv) status(t *testing.T, adapter, ns string) map[string]any {
	t.Helper()
	list := te.mustCall(t, FnList, map[string]any{})
	for _, a := range list["adapters"].([]any) {
		s := a.(map[string]any)
		if s["adapter"] == adapter && s["namespace"] == ns {
			return s
		}
	}
	t.Fatalf("adapter %s not listed in %s: %v", adapter, ns, list)
	return nil
}

func pollUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if cond() {
			return poll.Success()
		}
		return poll.Continue("%s", what)
	}, poll.WithTimeout(timeout), poll.WithDelay(10*time.Millisecond))
}

// adapterProcesses lists live processes whose command line names a file
// in dir (zombies, already dead, are not counted).
func adapterProcesses(dir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(dir+"/")) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

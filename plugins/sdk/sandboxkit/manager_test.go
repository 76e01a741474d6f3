package sandboxkit

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var ctx = context.Background()

// newManager returns a configured Manager over a fake provider; the
// Manager is shut down when the test ends.
func newManager(t *testing.T, cfg map[string]any) (*Manager, *fakeProvider) {
	t.Helper()
	p := newFakeProvider()
	m := New(p, Options{Name: "fake", Version: "1.0.0", ProviderConfigKeys: []string{"fake_key"}})
	if cfg == nil {
		cfg = map[string]any{}
	}
	if _, ok := cfg["image_allowlist"]; !ok {
		cfg["image_allowlist"] = []string{"python", "shell"}
	}
	raw, err := json.Marshal(cfg)
	assert.NilError(t, err)
	assert.NilError(t, m.Configure(ctx, raw))
	t.Cleanup(func() { assert.NilError(t, m.Shutdown(ctx)) })
	return m, p
}

func code(t *testing.T, err error) contract.Code {
	t.Helper()
	var se *contract.Error
	assert.Assert(t, errors.As(err, &se), "want a sandbox error, got %v", err)
	return se.Code
}

func create(t *testing.T, m *Manager, req *contract.CreateRequest) string {
	t.Helper()
	if req.Image == "" {
		req.Image = "python"
	}
	out, err := m.Create(ctx, req)
	assert.NilError(t, err)
	return out.SandboxID
}

func u32(v uint32) *uint32 { return &v }
func u64(v uint64) *uint64 { return &v }

func TestInfo(t *testing.T) {
	m := New(newFakeProvider(), Options{Name: "fake", Version: "1.0.0"})
	info, err := m.Info(ctx)
	assert.NilError(t, err)
	assert.DeepEqual(t, info, &contract.AdapterInfo{Adapter: "fake", AdapterVersion: "1.0.0", Contract: contract.Current(),
		Capabilities: []string{contract.CapabilityReconfigure}, Facts: map[string]any{"backend": "fake"}})
}

func TestNotConfigured(t *testing.T) {
	m := New(newFakeProvider(), Options{Name: "fake"})
	defer func() { assert.Check(t, m.Shutdown(ctx)) }()
	_, err := m.Create(ctx, &contract.CreateRequest{Image: "python"})
	assert.Equal(t, code(t, err), contract.S301)
	_, err = m.List(ctx, &contract.ListRequest{})
	assert.Equal(t, code(t, err), contract.S301)
	_, err = m.CatalogList(ctx, &contract.CatalogListRequest{})
	assert.Equal(t, code(t, err), contract.S301)
	_, err = m.Exec(ctx, &contract.ExecRequest{SandboxID: uuid.NewString(), Argv: []string{"echo"}})
	assert.Equal(t, code(t, err), contract.S301)
}

func TestConfigure(t *testing.T) {
	t.Run("provider keys reach the provider", func(t *testing.T) {
		m, p := newManager(t, map[string]any{"fake_key": map[string]any{"a": 1}})
		assert.DeepEqual(t, p.configured, map[string]json.RawMessage{"fake_key": json.RawMessage(`{"a":1}`)})
		// Configure again is a reload (reconfigure_test.go): the fake
		// provider has no Reconfigurer, so its key cannot change live.
		assert.Check(t, contract.IsRestartRequired(m.Configure(ctx, []byte(`{"image_allowlist":["python"]}`))))
	})
	t.Run("a provider rejection rejects the configuration", func(t *testing.T) {
		p := newFakeProvider()
		p.configErr = errors.New("fake_key must be a number")
		m := New(p, Options{ProviderConfigKeys: []string{"fake_key"}})
		defer func() { assert.Check(t, m.Shutdown(ctx)) }()
		assert.ErrorContains(t, m.Configure(ctx, []byte(`{"fake_key": "x"}`)), "fake_key must be a number")
	})
	t.Run("bad presets are an adapter bug", func(t *testing.T) {
		p := newFakeProvider()
		p.presets = append(p.presets, contract.CatalogImage{Name: "python"})
		m := New(p, Options{})
		defer func() { assert.Check(t, m.Shutdown(ctx)) }()
		assert.ErrorContains(t, m.Configure(ctx, nil), "twice")
	})
	t.Run("after shutdown", func(t *testing.T) {
		m := New(newFakeProvider(), Options{})
		assert.NilError(t, m.Shutdown(ctx))
		assert.ErrorContains(t, m.Configure(ctx, nil), "shutting down")
	})
}

func TestCatalogList(t *testing.T) {
	m, _ := newManager(t, map[string]any{"custom_images": map[string]any{"zeta": "z:1", "alpha": "a:1"}})
	out, err := m.CatalogList(ctx, &contract.CatalogListRequest{})
	assert.NilError(t, err)
	assert.DeepEqual(t, out.Images, []contract.CatalogImage{
		{Name: "python", OCIRef: "example/python:1", Kind: contract.KindPreset},
		{Name: "node", OCIRef: "example/node:1", Kind: contract.KindPreset},
		{Name: "shell", OCIRef: "example/shell:1", Kind: contract.KindPreset},
		{Name: "alpha", OCIRef: "a:1", Kind: contract.KindCustom},
		{Name: "zeta", OCIRef: "z:1", Kind: contract.KindCustom},
	})
}

func TestCreate(t *testing.T) {
	t.Run("defaults and the boot spec", func(t *testing.T) {
		m, p := newManager(t, map[string]any{"default_cpus": 2, "default_memory_mb": 256, "auto_install": false})
		out, err := m.Create(ctx, &contract.CreateRequest{Image: "shell", Name: "n", Network: true, Env: []string{"A=1"}})
		assert.NilError(t, err)
		id, err := uuid.Parse(out.SandboxID)
		assert.NilError(t, err)
		assert.Equal(t, id.Version(), uuid.Version(4))
		assert.Equal(t, out.Image, "shell")
		assert.DeepEqual(t, p.boots[0], BootSpec{
			ID: out.SandboxID, Image: contract.CatalogImage{Name: "shell", OCIRef: "example/shell:1", Kind: contract.KindPreset},
			AutoInstall: false, CPUs: 2, MemoryMB: 256, Network: true, Env: []string{"A=1"}, Name: "n", ReaperTick: DefaultReaperTick, IdleTimeout: 300 * time.Second,
		})
		m.mu.Lock()
		idle := m.sandboxes[out.SandboxID].idleTimeout
		m.mu.Unlock()
		assert.Equal(t, idle, 300*time.Second)
		create(t, m, &contract.CreateRequest{CPUs: u32(3), MemoryMB: u32(64), IdleTimeoutSecs: u64(7)})
		assert.Equal(t, p.boots[1].CPUs, uint32(3))
		assert.Equal(t, p.boots[1].MemoryMB, uint32(64))
	})
	t.Run("S100 lists the allowed images", func(t *testing.T) {
		m, _ := newManager(t, map[string]any{"image_allowlist": []string{"python", "extra"}, "custom_images": map[string]any{"extra": "x:1", "other": "o:1"}})
		for _, image := range []string{"nope", "node", "other"} {
			_, err := m.Create(ctx, &contract.CreateRequest{Image: image})
			assert.Equal(t, code(t, err), contract.S100)
			assert.Check(t, is.Contains(err.Error(), "allowed images: python, extra"))
		}
		create(t, m, &contract.CreateRequest{Image: "extra"})
	})
	t.Run("S100 with an empty allowlist", func(t *testing.T) {
		m, _ := newManager(t, map[string]any{"image_allowlist": []string{}})
		_, err := m.Create(ctx, &contract.CreateRequest{Image: "python"})
		assert.Equal(t, code(t, err), contract.S100)
		assert.Check(t, is.Contains(err.Error(), "image_allowlist is empty"))
	})
	t.Run("S400 per_image_caps", func(t *testing.T) {
		m, _ := newManager(t, map[string]any{"per_image_caps": map[string]any{"python": map[string]any{"max_cpus": 2, "max_memory_mb": 1024}}})
		_, err := m.Create(ctx, &contract.CreateRequest{Image: "python", CPUs: u32(3)})
		assert.Equal(t, code(t, err), contract.S400)
		_, err = m.Create(ctx, &contract.CreateRequest{Image: "python", MemoryMB: u32(2048)})
		assert.Equal(t, code(t, err), contract.S400)
		create(t, m, &contract.CreateRequest{Image: "python", CPUs: u32(2), MemoryMB: u32(1024)})
		create(t, m, &contract.CreateRequest{Image: "shell", CPUs: u32(8)})
	})
	t.Run("S400 max_concurrent_sandboxes counts live sandboxes only", func(t *testing.T) {
		m, _ := newManager(t, map[string]any{"max_concurrent_sandboxes": 2})
		a := create(t, m, &contract.CreateRequest{})
		create(t, m, &contract.CreateRequest{})
		_, err := m.Create(ctx, &contract.CreateRequest{Image: "python"})
		assert.Equal(t, code(t, err), contract.S400)
		_, err = m.Stop(ctx, &contract.StopRequest{SandboxID: a})
		assert.NilError(t, err)
		create(t, m, &contract.CreateRequest{})
	})
	t.Run("the cap holds under concurrent creates", func(t *testing.T) {
		m, _ := newManager(t, map[string]any{"max_concurrent_sandboxes": 3})
		var wg sync.WaitGroup
		var mu sync.Mutex
		ok, limited := 0, 0
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := m.Create(ctx, &contract.CreateRequest{Image: "python"})
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					ok++
				} else if contract.IsCode(err, contract.S400) {
					limited++
				}
			}()
		}
		waitfor.Group(t, &wg, waitfor.Default, "the concurrent calls")
		assert.Equal(t, ok, 3)
		assert.Equal(t, limited, 7)
	})
	t.Run("boot errors keep their code", func(t *testing.T) {
		m, p := newManager(t, nil)
		p.bootErr = contract.NewError(contract.S101, "rootfs missing")
		_, err := m.Create(ctx, &contract.CreateRequest{Image: "python"})
		assert.Equal(t, code(t, err), contract.S101)
		p.bootErr = errors.New("qemu exploded")
		_, err = m.Create(ctx, &contract.CreateRequest{Image: "python"})
		assert.Equal(t, code(t, err), contract.S300)
		assert.Check(t, is.Contains(err.Error(), "qemu exploded"))
	})
}

func TestExec(t *testing.T) {
	m, p := newManager(t, map[string]any{"max_exec_timeout_ms": 5000, "max_concurrent_exec_per_sandbox": 2})
	id := create(t, m, &contract.CreateRequest{})
	sb := p.sandbox(id)

	t.Run("a reply", func(t *testing.T) {
		out, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo", "hi", "there"}, Env: []string{"A=1"}, Workdir: "/w", Stdin: []byte("in"), TimeoutMS: 1000})
		assert.NilError(t, err)
		assert.Equal(t, out.Stdout, "hi there")
		assert.Check(t, out.Success)
		assert.Equal(t, *out.ExitCode, 0)
		assert.DeepEqual(t, sb.lastExec(), ExecSpec{Argv: []string{"echo", "hi", "there"}, Env: []string{"A=1"}, Workdir: "/w", Stdin: []byte("in"), Timeout: time.Second})
	})
	t.Run("the timeout is clamped", func(t *testing.T) {
		_, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo"}, TimeoutMS: 600000})
		assert.NilError(t, err)
		assert.Equal(t, sb.lastExec().Timeout, 5*time.Second)
	})
	t.Run("exit codes and success", func(t *testing.T) {
		out, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"exit", "3"}})
		assert.NilError(t, err)
		assert.Check(t, !out.Success)
		assert.Equal(t, *out.ExitCode, 3)
		out, err = m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"signal"}})
		assert.NilError(t, err)
		assert.Check(t, out.ExitCode == nil && !out.Success)
	})
	t.Run("S200 on timeout, naming the clamp", func(t *testing.T) {
		_, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"timeout"}, TimeoutMS: 9000})
		assert.Equal(t, code(t, err), contract.S200)
		assert.Check(t, is.Contains(err.Error(), "clamped to the adapter's max_exec_timeout_ms 5000"))
	})
	t.Run("output the provider forgot to cap is capped", func(t *testing.T) {
		out, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"flood"}})
		assert.NilError(t, err)
		assert.Equal(t, len(out.Stdout), contract.ExecOutputCap)
		assert.Check(t, out.StdoutTruncated && !out.StderrTruncated)
	})
	t.Run("a plain provider error is S300", func(t *testing.T) {
		_, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"fail"}})
		assert.Equal(t, code(t, err), contract.S300)
	})
	t.Run("S002 and S001", func(t *testing.T) {
		_, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: uuid.NewString(), Argv: []string{"echo"}})
		assert.Equal(t, code(t, err), contract.S002)
		_, err = m.Exec(ctx, &contract.ExecRequest{SandboxID: id})
		assert.Equal(t, code(t, err), contract.S001)
	})
	t.Run("S003 at the cap, no queueing", func(t *testing.T) {
		bctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = m.Exec(bctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"block"}})
			}()
		}
		waitInFlight(t, m, id, 2)
		_, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo"}})
		assert.Equal(t, code(t, err), contract.S003)
		// fs operations do not take exec slots.
		_, err = m.FsLs(ctx, &contract.FsLsRequest{SandboxID: id, Path: "/"})
		assert.NilError(t, err)
		cancel()
		waitfor.Group(t, &wg, waitfor.Default, "the cancelled calls to return")
		waitInFlight(t, m, id, 0)
	})
	for _, bin := range []string{"block", "block-s300"} {
		t.Run("S004 when the sandbox stops under a running exec: "+bin, func(t *testing.T) {
			id := create(t, m, &contract.CreateRequest{})
			errc := make(chan error, 1)
			go func() {
				_, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{bin}})
				errc <- err
			}()
			waitInFlight(t, m, id, 1)
			_, err := m.Stop(ctx, &contract.StopRequest{SandboxID: id})
			assert.NilError(t, err)
			assert.Equal(t, code(t, waitfor.Recv(t, errc, waitfor.Default, "the in-flight call to fail on Stop")), contract.S004)
			_, err = m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo"}})
			assert.Equal(t, code(t, err), contract.S004)
		})
	}
}

func TestExecZeroMeansOne(t *testing.T) {
	m, _ := newManager(t, map[string]any{"max_concurrent_exec_per_sandbox": 0})
	id := create(t, m, &contract.CreateRequest{})
	list, err := m.List(ctx, &contract.ListRequest{})
	assert.NilError(t, err)
	assert.Equal(t, list.Sandboxes[0].ExecSlotsFree, uint32(1))
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = m.Exec(bctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"block"}})
	}()
	waitInFlight(t, m, id, 1)
	_, err = m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo"}})
	assert.Equal(t, code(t, err), contract.S003)
	cancel()
	waitfor.Closed(t, done, waitfor.Default, "the cancelled call to return")
}

func waitInFlight(t *testing.T, m *Manager, id string, n uint32) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		list, err := m.List(ctx, &contract.ListRequest{})
		if err != nil {
			return poll.Error(err)
		}
		for _, e := range list.Sandboxes {
			if e.SandboxID == id && e.ExecInFlight == n {
				return poll.Success()
			}
		}
		return poll.Continue("waiting for %d execs in flight", n)
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(time.Millisecond))
}

func TestFsOps(t *testing.T) {
	m, p := newManager(t, nil)
	id := create(t, m, &contract.CreateRequest{})

	_, err := m.FsStat(ctx, &contract.FsStatRequest{SandboxID: id, Path: "/plain-error"})
	assert.Equal(t, code(t, err), contract.S216)
	_, err = m.FsStat(ctx, &contract.FsStatRequest{SandboxID: id, Path: "/missing"})
	assert.Equal(t, code(t, err), contract.S211)
	_, err = m.FsStat(ctx, &contract.FsStatRequest{SandboxID: id, Path: "/nil"})
	assert.Equal(t, code(t, err), contract.S216)
	_, err = m.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/a/b"}, strings.NewReader("x"))
	e := contract.AsError(err, "")
	assert.Equal(t, e.Code, contract.S211)
	assert.DeepEqual(t, e.Fix, map[string]any{"parents": true})

	_, err = m.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/a/b", Parents: true}, strings.NewReader("data"))
	assert.NilError(t, err)
	meta, body, err := m.FsRead(ctx, &contract.FsReadRequest{SandboxID: id, Path: "/a/b"})
	assert.NilError(t, err)
	assert.Equal(t, meta.Size, uint64(4))
	assert.NilError(t, body.Close())

	for _, call := range []func() error{
		func() error { _, err := m.FsLs(ctx, &contract.FsLsRequest{SandboxID: id}); return err },
		func() error { _, err := m.FsMkdir(ctx, &contract.FsMkdirRequest{SandboxID: id}); return err },
		func() error { _, err := m.FsRm(ctx, &contract.FsRmRequest{SandboxID: id}); return err },
		func() error { _, err := m.FsChmod(ctx, &contract.FsChmodRequest{SandboxID: id}); return err },
		func() error { _, err := m.FsMv(ctx, &contract.FsMvRequest{SandboxID: id}); return err },
		func() error { _, err := m.FsGrep(ctx, &contract.FsGrepRequest{SandboxID: id}); return err },
		func() error { _, err := m.FsSed(ctx, &contract.FsSedRequest{SandboxID: id}); return err },
	} {
		assert.NilError(t, call())
	}
	_ = p
	_, err = m.FsLs(ctx, &contract.FsLsRequest{SandboxID: uuid.NewString(), Path: "/"})
	assert.Equal(t, code(t, err), contract.S002)
	_, err = m.Stop(ctx, &contract.StopRequest{SandboxID: id})
	assert.NilError(t, err)
	_, _, err = m.FsRead(ctx, &contract.FsReadRequest{SandboxID: id, Path: "/a/b"})
	assert.Equal(t, code(t, err), contract.S004)
	_, err = m.FsWrite(ctx, &contract.FsWriteRequest{SandboxID: id, Path: "/x"}, nil)
	assert.Equal(t, code(t, err), contract.S004)
}

func TestRun(t *testing.T) {
	langs := []struct {
		lang, interpreter, file string
	}{
		{"node", "node", "/tmp/run.js"},
		{"js", "node", "/tmp/run.js"},
		{"javascript", "node", "/tmp/run.js"},
		{"python", "python3", "/tmp/run.py"},
		{"py", "python3", "/tmp/run.py"},
		{"shell", "/bin/sh", "/tmp/run.sh"},
		{"sh", "/bin/sh", "/tmp/run.sh"},
		{"bash", "/bin/sh", "/tmp/run.sh"},
		{"/usr/bin/ruby", "/usr/bin/ruby", "/tmp/run.txt"},
	}
	for _, tc := range langs {
		t.Run("lang "+tc.lang, func(t *testing.T) {
			m, p := newManager(t, nil)
			out, err := m.Run(ctx, &contract.RunRequest{Image: "python", Code: "code!", Lang: tc.lang, TimeoutMS: 1000,
				Files: []contract.RunFile{{Path: "rel/a.txt", Content: "A"}, {Path: "/abs/b.txt", Content: "B"}}})
			assert.NilError(t, err)
			assert.Equal(t, out.SandboxID, "")
			sb := p.sandboxes[0]
			assert.DeepEqual(t, sb.files, map[string]string{"/tmp/rel/a.txt": "A", "/abs/b.txt": "B", tc.file: "code!"})
			exec := sb.lastExec()
			assert.DeepEqual(t, exec.Argv, []string{tc.interpreter, tc.file})
			assert.Equal(t, exec.Workdir, "/tmp")
			assert.Equal(t, sb.stops(), 1, "the sandbox is stopped after a run")
		})
	}
	t.Run("keep_sandbox", func(t *testing.T) {
		m, p := newManager(t, nil)
		out, err := m.Run(ctx, &contract.RunRequest{Image: "python", Code: "x", Lang: "py", KeepSandbox: true, Env: []string{"A=1"}})
		assert.NilError(t, err)
		assert.Equal(t, out.SandboxID, p.sandboxes[0].spec.ID)
		assert.DeepEqual(t, p.sandboxes[0].spec.Env, []string{"A=1"})
		assert.Equal(t, p.sandboxes[0].stops(), 0)
	})
	t.Run("a failing create is wrapped without a sandbox", func(t *testing.T) {
		m, _ := newManager(t, nil)
		_, err := m.Run(ctx, &contract.RunRequest{Image: "node", Code: "x", Lang: "node"})
		e := contract.AsError(err, "")
		assert.Equal(t, e.Code, contract.S100)
		assert.DeepEqual(t, e.Fix, map[string]any{"context": "during sandbox::run step `create`", "sandbox_id": "", "inner_code": "S100"})
	})
	t.Run("a failing write is wrapped and the sandbox stopped", func(t *testing.T) {
		m, p := newManager(t, nil)
		p.writeErr = contract.NewError(contract.S215, "denied")
		_, err := m.Run(ctx, &contract.RunRequest{Image: "python", Code: "x", Lang: "py", Files: []contract.RunFile{{Path: "a", Content: "b"}}})
		e := contract.AsError(err, "")
		assert.Equal(t, e.Code, contract.S215)
		assert.DeepEqual(t, e.Fix, map[string]any{"context": "during sandbox::run step `fs::write (sibling file)`", "sandbox_id": p.sandboxes[0].spec.ID, "inner_code": "S215"})
		assert.Equal(t, p.sandboxes[0].stops(), 1)
		p.sandboxes[0].mu.Lock()
		p.sandboxes[0].writeErr = nil
		p.sandboxes[0].mu.Unlock()
	})
	t.Run("a timed-out exec is wrapped and the sandbox stopped", func(t *testing.T) {
		m, p := newManager(t, nil)
		_, err := m.Run(ctx, &contract.RunRequest{Image: "python", Code: "x", Lang: "timeout"})
		e := contract.AsError(err, "")
		assert.Equal(t, e.Code, contract.S200)
		assert.Equal(t, e.Fix["context"], "during sandbox::run step `exec`")
		assert.Equal(t, e.Fix["sandbox_id"], p.sandboxes[0].spec.ID)
		assert.Equal(t, e.Fix["inner_code"], "S200")
		assert.Equal(t, p.sandboxes[0].stops(), 1)
	})
	t.Run("a failed step with keep_sandbox keeps it", func(t *testing.T) {
		m, p := newManager(t, nil)
		_, err := m.Run(ctx, &contract.RunRequest{Image: "python", Code: "x", Lang: "timeout", KeepSandbox: true})
		assert.Equal(t, code(t, err), contract.S200)
		assert.Equal(t, p.sandboxes[0].stops(), 0)
	})
}

func TestListAndStop(t *testing.T) {
	m, p := newManager(t, map[string]any{"max_concurrent_exec_per_sandbox": 3})
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := base
	var clock sync.Mutex
	m.now = func() time.Time { clock.Lock(); defer clock.Unlock(); return now }
	a := create(t, m, &contract.CreateRequest{Name: "first"})
	clock.Lock()
	now = now.Add(5 * time.Second)
	clock.Unlock()
	b := create(t, m, &contract.CreateRequest{Image: "shell"})
	clock.Lock()
	now = now.Add(10 * time.Second)
	clock.Unlock()

	list, err := m.List(ctx, &contract.ListRequest{})
	assert.NilError(t, err)
	assert.DeepEqual(t, list.Sandboxes, []contract.ListEntry{
		{SandboxID: a, Name: "first", Image: "python", AgeSecs: 15, ExecSlotsFree: 3},
		{SandboxID: b, Image: "shell", AgeSecs: 10, ExecSlotsFree: 3},
	})

	out, err := m.Stop(ctx, &contract.StopRequest{SandboxID: a, Wait: true})
	assert.NilError(t, err)
	assert.DeepEqual(t, out, &contract.StopResponse{SandboxID: a, Stopped: true})
	assert.Check(t, p.sandbox(a).stopWait)
	_, err = m.Stop(ctx, &contract.StopRequest{SandboxID: a})
	assert.Equal(t, code(t, err), contract.S004)
	assert.Check(t, is.Contains(err.Error(), "stopped by sandbox::stop"))
	assert.Equal(t, p.sandbox(a).stops(), 1)
	_, err = m.Stop(ctx, &contract.StopRequest{SandboxID: uuid.NewString()})
	assert.Equal(t, code(t, err), contract.S002)

	list, err = m.List(ctx, &contract.ListRequest{})
	assert.NilError(t, err)
	assert.Check(t, list.Sandboxes[0].Stopped && list.Sandboxes[0].ExecSlotsFree == 0)
	assert.Check(t, !list.Sandboxes[1].Stopped)

	// Stopped sandboxes are forgotten after an hour: then S002.
	clock.Lock()
	now = now.Add(tombstoneTTL + time.Minute)
	clock.Unlock()
	list, err = m.List(ctx, &contract.ListRequest{})
	assert.NilError(t, err)
	assert.Equal(t, len(list.Sandboxes), 1)
	_, err = m.Stop(ctx, &contract.StopRequest{SandboxID: a})
	assert.Equal(t, code(t, err), contract.S002)
}

func TestSandboxDiesOnItsOwn(t *testing.T) {
	m, p := newManager(t, nil)
	id := create(t, m, &contract.CreateRequest{})
	p.sandbox(id).die()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		list, _ := m.List(ctx, &contract.ListRequest{})
		if list.Sandboxes[0].Stopped {
			return poll.Success()
		}
		return poll.Continue("not marked stopped yet")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(time.Millisecond))
	_, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo"}})
	assert.Equal(t, code(t, err), contract.S004)
	assert.Check(t, is.Contains(err.Error(), "exited on its own"))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if p.sandbox(id).stops() == 1 {
			return poll.Success()
		}
		return poll.Continue("not cleaned up yet")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(time.Millisecond))
}

func TestReaper(t *testing.T) {
	m, p := newManager(t, map[string]any{"default_idle_timeout_secs": 60, "max_exec_timeout_ms": 10000})
	start := time.Now()
	now := start
	var clock sync.Mutex
	m.now = func() time.Time { clock.Lock(); defer clock.Unlock(); return now }
	at := func(d time.Duration) time.Time { return start.Add(d) }

	idle := create(t, m, &contract.CreateRequest{})
	busy := create(t, m, &contract.CreateRequest{})
	chatty := create(t, m, &contract.CreateRequest{})
	short := create(t, m, &contract.CreateRequest{IdleTimeoutSecs: u64(5)})

	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	execDone := make(chan struct{})
	go func() {
		defer close(execDone)
		_, _ = m.Exec(bctx, &contract.ExecRequest{SandboxID: busy, Argv: []string{"block"}})
	}()
	waitInFlight(t, m, busy, 1)
	p.sandbox(chatty).mu.Lock()
	p.sandbox(chatty).activity = at(50 * time.Second)
	p.sandbox(chatty).mu.Unlock()

	assert.DeepEqual(t, m.reapOnce(at(4*time.Second)), []string{})
	assert.DeepEqual(t, m.reapOnce(at(6*time.Second)), []string{short})
	got := m.reapOnce(at(61 * time.Second))
	assert.DeepEqual(t, got, []string{idle})
	// Relayed activity at 50 s moves chatty's idle clock.
	assert.DeepEqual(t, m.reapOnce(at(109*time.Second)), []string{})
	assert.DeepEqual(t, m.reapOnce(at(111*time.Second)), []string{chatty})
	// The busy sandbox is exempt until idle + max exec + 60 s = 130 s.
	assert.DeepEqual(t, m.reapOnce(at(129*time.Second)), []string{})
	assert.DeepEqual(t, m.reapOnce(at(131*time.Second)), []string{busy})
	waitfor.Closed(t, execDone, waitfor.Default, "the busy sandbox's exec to end")

	_, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: idle, Argv: []string{"echo"}})
	assert.Equal(t, code(t, err), contract.S004)
	assert.Check(t, is.Contains(err.Error(), "reaped after"))
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, id := range []string{idle, busy, chatty, short} {
			if p.sandbox(id).stops() != 1 {
				return poll.Continue("%s not stopped yet", id)
			}
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(time.Millisecond))
}

func TestReaperRunsOnItsTick(t *testing.T) {
	m, p := newManager(t, map[string]any{"reaper_tick_ms": 10})
	id := create(t, m, &contract.CreateRequest{IdleTimeoutSecs: u64(1)})
	m.mu.Lock()
	m.sandboxes[id].touch(time.Now().Add(-time.Hour))
	m.mu.Unlock()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if p.sandbox(id).stops() == 1 {
			return poll.Success()
		}
		return poll.Continue("not reaped yet")
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(5*time.Millisecond))
}

func TestShutdown(t *testing.T) {
	p := newFakeProvider()
	m := New(p, Options{})
	assert.NilError(t, m.Configure(ctx, []byte(`{"image_allowlist":["python"]}`)))
	a := create(t, m, &contract.CreateRequest{})
	b := create(t, m, &contract.CreateRequest{})
	_, err := m.Stop(ctx, &contract.StopRequest{SandboxID: b})
	assert.NilError(t, err)
	assert.NilError(t, m.Shutdown(ctx))
	assert.Equal(t, p.sandbox(a).stops(), 1)
	assert.Equal(t, p.sandbox(b).stops(), 1)
	_, err = m.Create(ctx, &contract.CreateRequest{Image: "python"})
	assert.Equal(t, code(t, err), contract.S300)
	assert.NilError(t, m.Shutdown(ctx))
}

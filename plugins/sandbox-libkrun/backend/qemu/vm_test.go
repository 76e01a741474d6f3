package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/hostfacts"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/initramfs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/usernet"
)

// vmKit is what booting a test VM needs, built once per test binary.
type vmKit struct {
	dir     string
	kernel  *Kernel
	agent   string // static agent binary
	initrd  string // agent + modules
	rootImg string // erofs: busybox + /etc/marker
	busybox string
	err     error
	skip    string
}

var (
	kitOnce sync.Once
	kit     vmKit
)

const marker = "iii-vm-test-marker\n"

// cleanupKit removes what buildKit made; TestMain calls it.
func cleanupKit() {
	if kit.dir != "" {
		_ = os.RemoveAll(kit.dir)
	}
}

// needVM skips unless the host can boot a test VM, and builds the pieces.
func needVM(t testing.TB) *vmKit {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM; skipped with -short")
	}
	kitOnce.Do(func() { kit = buildKit() })
	if kit.skip != "" {
		t.Skip(kit.skip)
	}
	assert.NilError(t, kit.err)
	return &kit
}

func buildKit() vmKit {
	var k vmKit
	cfg := Config{Accel: AccelTCG}
	if _, err := cfg.Binary(); err != nil {
		k.skip = "QEMU not installed (run scripts/setup-vm.sh): " + err.Error()
		return k
	}
	kern, err := FindKernel("/boot", "/lib/modules", runtime.GOARCH)
	if err != nil {
		k.skip = "no guest kernel (run scripts/setup-vm.sh): " + err.Error()
		return k
	}
	k.kernel = kern
	for _, tool := range []string{"mkfs.erofs", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			k.skip = tool + " not installed (run scripts/setup-vm.sh)"
			return k
		}
	}
	k.busybox, _ = exec.LookPath("busybox")
	dir, err := os.MkdirTemp("", "iii-vmkit-")
	if err != nil {
		k.err = err
		return k
	}
	k.dir = dir
	k.agent = filepath.Join(dir, "iii-guest-agent")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", k.agent, "github.com/iii-sandbox/iii/plugins/sandbox-libkrun/cmd/iii-guest-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		k.err = fmt.Errorf("build the agent: %v\n%s", err, out)
		return k
	}
	k.initrd, err = initramfs.Build(context.Background(), initramfs.Options{
		AgentPath: k.agent, ModulesDir: kern.ModulesDir, KernelConfig: kern.Config, CacheDir: filepath.Join(dir, "cache"),
	})
	if err != nil {
		k.err = err
		return k
	}
	k.rootImg, k.err = buildRootImage(dir, k.busybox)
	return k
}

// buildRootImage makes a tiny erofs image: busybox with its applet links
// and a marker file.
func buildRootImage(dir, busybox string) (string, error) {
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "run", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755); err != nil {
		return "", err
	}
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return "", fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "etc/marker"), []byte(marker), 0o644); err != nil {
		return "", err
	}
	img := filepath.Join(dir, "root.erofs")
	if out, err := exec.Command("mkfs.erofs", "-zlz4hc", img, root).CombinedOutput(); err != nil {
		return "", fmt.Errorf("mkfs.erofs: %v\n%s", err, out)
	}
	return img, nil
}

type bootedVM struct {
	vm          *VM
	client      *agentclient.Client
	timeToHello time.Duration
}

// boot starts a TCG VM and connects to its agent; cleanup kills it.
func boot(t testing.TB, k *vmKit, cfg Config) *bootedVM {
	t.Helper()
	cfg.Accel = AccelTCG
	cfg.Kernel = k.kernel.Path
	if cfg.Initrd == "" {
		cfg.Initrd = k.initrd
	}
	// Unix socket paths must stay short; t.TempDir can be long.
	dir, err := os.MkdirTemp("", "iii-vm-")
	assert.NilError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg.StateDir = dir
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	vm, err := Launch(ctx, cfg)
	assert.NilError(t, err)
	t.Cleanup(func() {
		_ = vm.Kill()
		if t.Failed() {
			t.Logf("console tail:\n%s\nqemu stderr:\n%s", vm.ConsoleTail(40), vm.StderrTail(20))
		}
	})
	c, err := vm.Connect(ctx, agentclient.Options{})
	assert.NilError(t, err)
	b := &bootedVM{vm: vm, client: c, timeToHello: time.Since(start)}
	t.Cleanup(func() { _ = c.Close() })
	return b
}

func run(t testing.TB, c *agentclient.Client, req agentclient.ExecRequest) *agentclient.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.Exec(ctx, req)
	assert.NilError(t, err)
	return res
}

// TestVM boots a real VM under QEMU TCG with the agent initramfs and an
// erofs root, and drives it end to end through the agent protocol.
func TestVM(t *testing.T) {
	k := needVM(t)
	b := boot(t, k, Config{RootDisk: k.rootImg, MemoryMiB: 256})
	c := b.client
	ctx := context.Background()
	t.Logf("time to HELLO: %s (guest uptime at ready %d ms)", b.timeToHello, c.Hello().BootMS)

	t.Run("hello", func(t *testing.T) {
		h := c.Hello()
		assert.Equal(t, h.Root, "overlay")
		assert.Equal(t, h.Arch, runtime.GOARCH)
		assert.Equal(t, h.Kernel, k.kernel.Version)
		assert.Assert(t, h.Has(agentproto.CapExec) && h.Has(agentproto.CapFSSed) && h.Has(agentproto.CapShutdown))
	})
	t.Run("echo", func(t *testing.T) {
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"echo", "hi"}})
		assert.Equal(t, string(res.Stdout), "hi\n")
		assert.Equal(t, res.ExitCode, 0)
	})
	t.Run("true", func(t *testing.T) {
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"true"}})
		assert.Equal(t, res.ExitCode, 0)
	})
	t.Run("missing binary is 127", func(t *testing.T) {
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"no-such-program"}})
		assert.Equal(t, res.ExitCode, 127)
	})
	t.Run("not executable is 126", func(t *testing.T) {
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"/etc/marker"}})
		assert.Equal(t, res.ExitCode, 126)
	})
	t.Run("the image is the root", func(t *testing.T) {
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"cat", "/etc/marker"}})
		assert.Equal(t, string(res.Stdout), marker)
		// Writable through the tmpfs upper layer.
		res = run(t, c, agentclient.ExecRequest{Argv: []string{"sh", "-c", "echo new > /etc/added && cat /etc/added && grep -c overlay /proc/mounts"}})
		assert.Equal(t, res.ExitCode, 0, string(res.Stderr))
		assert.Assert(t, strings.HasPrefix(string(res.Stdout), "new\n"), string(res.Stdout))
	})
	t.Run("stdin", func(t *testing.T) {
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"wc", "-c"}, Stdin: strings.NewReader(strings.Repeat("x", 100000))})
		assert.Equal(t, strings.TrimSpace(string(res.Stdout)), "100000")
	})
	t.Run("timeout leaves nothing alive", func(t *testing.T) {
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"sh", "-c", "sleep 1000 & sleep 1001 & wait"}, Timeout: 500 * time.Millisecond})
		assert.Assert(t, res.TimedOut)
		assert.Equal(t, res.ExitCode, 137)
		ps := run(t, c, agentclient.ExecRequest{Argv: []string{"ps", "-o", "pid,stat,args"}})
		assert.Assert(t, !strings.Contains(string(ps.Stdout), "sleep 100"), string(ps.Stdout))
	})
	t.Run("orphans are reaped", func(t *testing.T) {
		run(t, c, agentclient.ExecRequest{Argv: []string{"sh", "-c", "sleep 0.2 & exit 0"}})
		// Reaped: the orphan is neither running any more nor left a
		// zombie (a zombie would keep this waiting until it fails).
		poll.WaitOn(t, func(poll.LogT) poll.Result {
			ps := run(t, c, agentclient.ExecRequest{Argv: []string{"ps", "-o", "pid,stat,args"}})
			for _, line := range strings.Split(string(ps.Stdout), "\n")[1:] {
				f := strings.Fields(line)
				if len(f) >= 2 && strings.HasPrefix(f[1], "Z") {
					return poll.Continue("zombie: %s", line)
				}
				if strings.Contains(line, "sleep 0.2") {
					return poll.Continue("the orphan still runs: %s", line)
				}
			}
			return poll.Success()
		}, poll.WithTimeout(waitfor.Default), poll.WithDelay(200*time.Millisecond))
	})
	t.Run("write then read a file", func(t *testing.T) {
		_, err := c.WriteFile(ctx, &agentproto.FSRequest{Path: "/work/hello.txt", Parents: true}, strings.NewReader("hello from the host\n"))
		assert.NilError(t, err)
		var buf bytes.Buffer
		meta, n, err := c.ReadFileTo(ctx, "/work/hello.txt", &buf)
		assert.NilError(t, err)
		assert.Equal(t, buf.String(), "hello from the host\n")
		assert.Equal(t, n, int64(20))
		assert.Equal(t, meta.Mode, "0644")
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"cat", "/work/hello.txt"}})
		assert.Equal(t, string(res.Stdout), "hello from the host\n")
	})
	t.Run("10 MiB streamed write and read", func(t *testing.T) {
		data := make([]byte, 10<<20)
		for i := range data {
			data[i] = byte(i*31 + i/4096)
		}
		sum := sha256.Sum256(data)
		start := time.Now()
		w, err := c.WriteFile(ctx, &agentproto.FSRequest{Path: "/tmp/big.bin"}, bytes.NewReader(data))
		assert.NilError(t, err)
		assert.Equal(t, w.BytesWritten, int64(len(data)))
		wrote := time.Since(start)
		// The guest computes the same hash.
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"sha256sum", "/tmp/big.bin"}})
		assert.Equal(t, strings.Fields(string(res.Stdout))[0], hex.EncodeToString(sum[:]))
		start = time.Now()
		h := sha256.New()
		_, n, err := c.ReadFileTo(ctx, "/tmp/big.bin", h)
		assert.NilError(t, err)
		assert.Equal(t, n, int64(len(data)))
		assert.Equal(t, hex.EncodeToString(h.Sum(nil)), hex.EncodeToString(sum[:]))
		t.Logf("10 MiB write %s, read %s", wrote, time.Since(start))
	})
	t.Run("fs ops", func(t *testing.T) {
		ls, err := c.Ls(ctx, "/etc")
		assert.NilError(t, err)
		var names []string
		for _, e := range ls.Entries {
			names = append(names, e.Name)
		}
		assert.Assert(t, strings.Contains(strings.Join(names, " "), "marker"), "%v", names)
		g, err := c.Grep(ctx, &agentproto.FSRequest{Path: "/etc", Pattern: "vm-test", IncludeGlob: []string{"marker"}})
		assert.NilError(t, err)
		assert.Equal(t, len(g.Matches), 1)
		_, err = c.Mkdir(ctx, "/a/b", "", false)
		var ae *agentproto.Error
		assert.Assert(t, asAgentErr(err, &ae))
		assert.Equal(t, ae.Code, agentproto.CodeFSNotFound)
		assert.Assert(t, ae.ParentMissing)
	})
	t.Run("concurrent execs", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := c.Exec(ctx, agentclient.ExecRequest{Argv: []string{"sh", "-c", "echo $0", strconv.Itoa(i)}})
				if assert.Check(t, err) {
					assert.Check(t, string(res.Stdout) == strconv.Itoa(i)+"\n")
				}
			}()
		}
		waitfor.Group(t, &wg, 2*time.Minute, "the concurrent execs in the VM")
	})
	t.Run("shutdown powers off", func(t *testing.T) {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		assert.NilError(t, c.Shutdown(sctx))
		assert.NilError(t, b.vm.Wait(sctx), "QEMU exits with status 0")
	})
}

func asAgentErr(err error, target **agentproto.Error) bool {
	e, ok := err.(*agentproto.Error)
	if ok {
		*target = e
	}
	return ok
}

// TestVMInitramfsRootWithNetwork boots with no root disk (the initramfs is
// the root; busybox comes in the initramfs) and with a NIC served by
// usernet, as the runner serves it. The gateway's one forwarded port
// reaches a server on the host's loopback; the server's own port through
// the gateway does not (QEMU's user network used to map it there); the
// DNS address answers localhost itself.
func TestVMInitramfsRootWithNetwork(t *testing.T) {
	k := needVM(t)
	bb, err := os.ReadFile(k.busybox)
	assert.NilError(t, err)
	cache := t.TempDir()
	initrd, err := initramfs.Build(context.Background(), initramfs.Options{
		AgentPath: k.agent, ModulesDir: k.kernel.ModulesDir, KernelConfig: k.kernel.Config, CacheDir: cache,
		Extra: []initramfs.File{
			{Path: "/bin/busybox", Mode: 0o755, Data: bb},
			{Path: "/bin/sh", Symlink: "busybox"},
			{Path: "/bin/wget", Symlink: "busybox"},
			{Path: "/bin/ip", Symlink: "busybox"},
			{Path: "/bin/cat", Symlink: "busybox"},
			{Path: "/bin/nslookup", Symlink: "busybox"},
		},
	})
	assert.NilError(t, err)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	assert.NilError(t, err)
	var hits atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "hello from the host loopback\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	nic := serveNetwork(t, usernet.Config{
		Forwards:   []usernet.Forward{{GuestPort: 8080, HostAddr: netip.MustParseAddrPort(ln.Addr().String())}},
		DNSServers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}, // localhost never asks it
	})
	b := boot(t, k, Config{Initrd: initrd, Network: true, NetSocket: nic, MemoryMiB: 256})
	_ = nic.Close() // QEMU holds its own
	c := b.client
	assert.Equal(t, c.Hello().Root, "initramfs")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := c.ConfigureNetwork(ctx, agentproto.NetRequest{})
	assert.NilError(t, err)
	assert.Equal(t, res.Address, "10.0.2.15/24")
	out := run(t, c, agentclient.ExecRequest{Argv: []string{"ip", "addr", "show", "eth0"}})
	assert.Assert(t, strings.Contains(string(out.Stdout), "10.0.2.15/24"), string(out.Stdout))
	out = run(t, c, agentclient.ExecRequest{Argv: []string{"wget", "-q", "-O", "-", "http://10.0.2.2:8080/"}})
	assert.Equal(t, out.ExitCode, 0, string(out.Stderr))
	assert.Equal(t, string(out.Stdout), "hello from the host loopback\n")
	out = run(t, c, agentclient.ExecRequest{Argv: []string{"wget", "-q", "-T", "5", "-O", "-", fmt.Sprintf("http://10.0.2.2:%d/", port)}})
	assert.Assert(t, out.ExitCode != 0, "the gateway led to the host's loopback: %s", out.Stdout)
	assert.Equal(t, hits.Load(), int32(1))
	out = run(t, c, agentclient.ExecRequest{Argv: []string{"cat", "/etc/resolv.conf"}})
	assert.Equal(t, string(out.Stdout), "nameserver 10.0.2.3\n")
	out = run(t, c, agentclient.ExecRequest{Argv: []string{"nslookup", "localhost", "10.0.2.3"}})
	assert.Equal(t, out.ExitCode, 0, "%s%s", out.Stdout, out.Stderr)
	assert.Assert(t, strings.Contains(string(out.Stdout), "127.0.0.1"), string(out.Stdout))
}

// serveNetwork runs a usernet network on one end of a socketpair and
// returns the other, for QEMU; the network ends when the VM does (a
// clean-up registered before the VM's, so it runs after it).
func serveNetwork(t testing.TB, cfg usernet.Config) *os.File {
	t.Helper()
	host, vm, err := usernet.Pair()
	assert.NilError(t, err)
	conn, err := net.FileConn(host)
	_ = host.Close()
	assert.NilError(t, err)
	n, err := usernet.New(cfg)
	assert.NilError(t, err)
	done := make(chan error, 1)
	go func() { done <- n.Serve(context.Background(), conn) }()
	t.Cleanup(func() {
		select {
		case err := <-done:
			assert.Check(t, err)
		case <-time.After(30 * time.Second):
			t.Error("the network did not end with its VM")
			_ = conn.Close()
			waitfor.Recv(t, done, waitfor.Default, "the network to end once its socket closed")
		}
	})
	return vm
}

// TestProbe probes the accelerators with the agent initramfs. TCG must
// boot; a KVM that cannot boot the kernel (nested PVM on the build
// machines) must be reported unusable instead of hanging.
func TestProbe(t *testing.T) {
	k := needVM(t)
	dir, err := os.MkdirTemp("", "iii-probe-")
	assert.NilError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	p := NewProber(ProbeConfig{Kernel: k.kernel.Path, Initrd: k.initrd, StateDir: dir})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := p.Probe(ctx)
	assert.NilError(t, err)
	// What the host offered is a finding, not a failure: only TCG must boot.
	t.Logf("host KVM: %s", hostfacts.ProbeKVM(""))
	var findings strings.Builder
	for _, r := range res.Results {
		t.Logf("%s: ok=%v hello=%s reason=%q", r.Accel, r.OK, r.TimeToHello, r.Reason)
		if r.OK {
			fmt.Fprintf(&findings, "%s boots (hello in %s)\n", r.Accel, r.TimeToHello.Round(time.Millisecond))
		} else {
			fmt.Fprintf(&findings, "%s unusable (%s)\n", r.Accel, r.Reason)
		}
	}
	t.Logf("probe took %s", time.Since(start))
	// make test prints this at the end (scripts/testenv), so a failing run
	// says which accelerator its VMs had.
	if dir := os.Getenv("III_TEST_FACTS"); dir != "" {
		assert.NilError(t, os.MkdirAll(dir, 0o755))
		assert.NilError(t, os.WriteFile(filepath.Join(dir, "qemu-probe.txt"), []byte(findings.String()), 0o644))
	}
	var tcg *AccelResult
	for i := range res.Results {
		if res.Results[i].Accel == AccelTCG {
			tcg = &res.Results[i]
		}
	}
	assert.Assert(t, tcg != nil && tcg.OK, "tcg must boot: %+v", res.Results)
	best, err := res.Usable()
	assert.NilError(t, err)
	assert.Assert(t, best != "")
	again, err := p.Probe(ctx)
	assert.NilError(t, err)
	assert.Assert(t, again == res, "the result is cached")
}

// TestVMMeasure prints the figures of spec/vm-recipe.md for this tree. It
// asserts nothing about them; run it with III_VM_MEASURE=1.
func TestVMMeasure(t *testing.T) {
	if os.Getenv("III_VM_MEASURE") == "" {
		t.Skip("set III_VM_MEASURE=1 to measure")
	}
	k := needVM(t)
	var hellos []time.Duration
	for range 3 {
		b := boot(t, k, Config{RootDisk: k.rootImg, MemoryMiB: 256})
		hellos = append(hellos, b.timeToHello)
		h := b.client.Hello()
		t.Logf("boot: QEMU start → hello %s; guest uptime when the agent was ready %d ms, at hello %d ms",
			b.timeToHello, h.BootMS, h.UptimeMS)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = b.client.Shutdown(ctx)
		_ = b.vm.Wait(ctx)
		cancel()
	}
	t.Logf("time to HELLO (QEMU start → hello, erofs root): %v", hellos)

	b := boot(t, k, Config{RootDisk: k.rootImg, MemoryMiB: 256})
	c := b.client
	run(t, c, agentclient.ExecRequest{Argv: []string{"true"}}) // warm up
	var rtt, guest []time.Duration
	for range 100 {
		start := time.Now()
		res := run(t, c, agentclient.ExecRequest{Argv: []string{"true"}})
		rtt = append(rtt, time.Since(start))
		guest = append(guest, res.Duration)
	}
	t.Logf("exec true round trip over 100 runs: p50 %s p99 %s (min %s max %s)", pct(rtt, 50), pct(rtt, 99), pct(rtt, 0), pct(rtt, 100))
	t.Logf("in-guest fork+exec+wait of /bin/true (agent): p50 %s p99 %s", pct(guest, 50), pct(guest, 99))
	// The floor in the same VM and run: busybox sh forking /bin/true.
	loop := run(t, c, agentclient.ExecRequest{Argv: []string{"sh", "-c", "i=0; while [ $i -lt 200 ]; do /bin/true; i=$((i+1)); done"}})
	t.Logf("floor: busybox sh fork+exec+wait of /bin/true: %s each (200 in %s)", loop.Duration/200, loop.Duration)
	time.Sleep(5 * time.Second)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", b.vm.PID))
	assert.NilError(t, err)
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmRSS") || strings.HasPrefix(line, "RssAnon") || strings.HasPrefix(line, "RssFile") {
			t.Logf("QEMU idle (-m 256, 5 s after the runs): %s", strings.Join(strings.Fields(line), " "))
		}
	}
}

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s) - 1) * p / 100
	return s[i]
}

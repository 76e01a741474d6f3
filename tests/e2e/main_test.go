package e2e

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/internal/testkit/nodesdk"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

// The preset images the tests pull, as scripts/build-images.sh names them in
// the local OCI layout.
const (
	pythonRef = "docker.io/iiidev/python:latest"
	nodeRef   = "docker.io/iiidev/node:latest"
)

// envBinDir names a directory holding iii, sandbox-libkrun and the guest
// agent (`make test` sets it to bin/); without it TestMain builds them.
const envBinDir = "III_BIN_DIR"

// suite is what every test shares. TestMain fills it before any test runs;
// tests only read it.
type suite struct {
	// skip, when set, is why the tests cannot run on this host.
	skip string
	// iii and adapterBin are the binaries under test; the guest agent sits
	// beside adapterBin, where the adapter looks first.
	iii, adapterBin string
	// layout is the local OCI layout scripts/build-images.sh fills; the
	// tests only read it.
	layout string
	// packages is a directory package registry holding sandbox-libkrun
	// (adapter and agent) at adapter.Version, for package:// workers.
	packages string
	// node and sdkURL run the published Node SDK; empty when it is not
	// installed (the tests that need it skip).
	node, sdkURL, nodeSkip string
}

var shared suite

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if testing.Short() {
		shared.skip = "boots VMs through the engine; skipped with -short"
		return m.Run()
	}
	work, err := os.MkdirTemp("", "iii-tests-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(work)
	s, err := setup(work)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	shared = s
	code := m.Run()
	if code == 0 {
		// Every engine, client, registry and server a test started must
		// be gone with it.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			return 1
		}
	}
	return code
}

// setup checks what the host must have, then builds (or finds) the
// binaries and publishes the adapter package.
func setup(work string) (suite, error) {
	var s suite
	if _, err := (&qemu.Config{}).Binary(); err != nil {
		s.skip = "QEMU is not installed (scripts/setup-vm.sh installs it): " + err.Error()
		return s, nil
	}
	if _, err := qemu.FindKernel("/boot", "/lib/modules", runtime.GOARCH); err != nil {
		s.skip = "no guest kernel (scripts/setup-vm.sh installs one): " + err.Error()
		return s, nil
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		s.skip = "mkfs.erofs is not installed (scripts/setup-vm.sh installs erofs-utils); the adapter needs it to install pulled images"
		return s, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return s, err
	}
	s.layout = filepath.Join(home, ".iii", "cache", "oci")
	for _, ref := range []string{pythonRef, nodeRef} {
		e, err := ocilayout.Find(s.layout, ref)
		if err != nil {
			return s, fmt.Errorf("read the OCI layout %s: %w", s.layout, err)
		}
		if e == nil {
			s.skip = fmt.Sprintf("%s is not in the local OCI layout %s: run scripts/build-images.sh", ref, s.layout)
			return s, nil
		}
	}

	bins := os.Getenv(envBinDir)
	if bins == "" {
		bins = filepath.Join(work, "bin")
		if err := buildAll(bins); err != nil {
			return s, err
		}
	}
	// Absolute and without symlinks: tests compare it with
	// /proc/<pid>/exe.
	if bins, err = filepath.Abs(bins); err != nil {
		return s, err
	}
	if bins, err = filepath.EvalSymlinks(bins); err != nil {
		return s, err
	}
	s.iii = filepath.Join(bins, "iii")
	s.adapterBin = filepath.Join(bins, "sandbox-libkrun")
	agent := filepath.Join(bins, adapter.AgentName(runtime.GOARCH))
	for _, f := range []string{s.iii, s.adapterBin, agent} {
		if _, err := os.Stat(f); err != nil {
			return s, fmt.Errorf("%s: %w (set $%s to a directory `make build` filled, or leave it unset to build here)", f, err, envBinDir)
		}
	}

	// A directory registry with the adapter and its agent side by side,
	// as `make build` publishes bin/registry, so package://sandbox-libkrun
	// resolves with no network and runs these very binaries.
	s.packages = filepath.Join(work, "registry")
	if _, err := registry.Publish(s.packages, registry.Publication{
		Name:    "sandbox-libkrun",
		Kind:    registry.KindBinary,
		Version: adapter.Version,
		Target:  registry.HostPlatform().Target(),
		Files:   []registry.PublishFile{{Path: s.adapterBin}, {Path: agent}},
		DefaultConfig: json.RawMessage(`{"auto_install":true,"default_cpus":1,"default_idle_timeout_secs":300,` +
			`"default_memory_mb":512,"image_allowlist":["python","node"],"max_concurrent_sandboxes":32}`),
		Tags: []string{registry.TagLatest},
		Now:  time.Now(),
	}); err != nil {
		return s, fmt.Errorf("publish sandbox-libkrun: %w", err)
	}

	s.node, s.sdkURL, s.nodeSkip = findNodeSDK()
	return s, nil
}

// buildAll builds the three binaries into dir the way `make build` does.
func buildAll(dir string) error {
	for _, b := range []struct {
		out, pkg string
		env      []string
		flags    []string
	}{
		{"iii", "github.com/iii-sandbox/iii/cmd/iii", nil, nil},
		{"sandbox-libkrun", "github.com/iii-sandbox/iii/plugins/sandbox-libkrun/cmd/sandbox-libkrun", nil, nil},
		{adapter.AgentName(runtime.GOARCH), "github.com/iii-sandbox/iii/plugins/sandbox-libkrun/cmd/iii-guest-agent",
			[]string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=" + runtime.GOARCH}, []string{"-ldflags=-s -w"}},
	} {
		args := append([]string{"build", "-trimpath", "-o", filepath.Join(dir, b.out)}, b.flags...)
		cmd := exec.Command("go", append(args, b.pkg)...)
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", b.out, err, out)
		}
	}
	return nil
}

// findNodeSDK locates node and the pinned iii-sdk (make setup-test installs
// it under testdata/nodesdk at the repository root).
func findNodeSDK() (node, sdkURL, skip string) {
	wd, err := os.Getwd()
	if err != nil {
		return "", "", err.Error()
	}
	sdk, err := nodesdk.Locate(wd)
	if err != nil {
		return "", "", err.Error()
	}
	return sdk.Node, sdk.URL, ""
}

// needVMs skips a test that boots VMs when this host cannot.
func needVMs(t *testing.T) *suite {
	t.Helper()
	if shared.skip != "" {
		t.Skip(shared.skip)
	}
	return &shared
}

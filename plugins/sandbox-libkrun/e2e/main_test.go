package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
)

// env is what every test of this package shares, set up once by TestMain:
// the adapter and agent binaries built from this tree, and an image cache
// whose local OCI layout is the one scripts/build-images.sh fills.
type env struct {
	// bin is the sandbox-libkrun binary; the guest agent sits beside it,
	// where the adapter looks first.
	bin string
	// cacheDir is shared by every adapter the tests start, so the python
	// image is turned into a block image and the accelerator probe runs
	// once per test binary.
	cacheDir string
	// layout is the local OCI layout scripts/build-images.sh fills.
	layout string
	// skip, when set, is why VM tests cannot run here.
	skip string
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

// shared is set by TestMain before any test runs and read-only after.
var shared env

func run(m *testing.M) int {
	if testing.Short() {
		shared.skip = "boots VMs; skipped with -short"
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "iii-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	e, err := setup(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	shared = e
	return m.Run()
}

// pythonRef is the preset the tests boot; nodeRef the other one.
const (
	pythonRef = "docker.io/iiidev/python:latest"
	nodeRef   = "docker.io/iiidev/node:latest"
)

func setup(dir string) (env, error) {
	var e env
	if _, err := (&qemu.Config{}).Binary(); err != nil {
		e.skip = "QEMU is not installed (scripts/setup-vm.sh installs it): " + err.Error()
		return e, nil
	}
	if _, err := qemu.FindKernel("/boot", "/lib/modules", runtime.GOARCH); err != nil {
		e.skip = "no guest kernel (scripts/setup-vm.sh installs one): " + err.Error()
		return e, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return e, err
	}
	layout := filepath.Join(home, ".iii", "cache", "oci")
	if !layoutHas(layout, pythonRef) {
		e.skip = fmt.Sprintf("the python image is not in the local OCI layout %s: run scripts/build-images.sh", layout)
		return e, nil
	}
	var adapterFlags []string
	if os.Getenv(envRace) != "" {
		adapterFlags = append(adapterFlags, "-race")
	}
	bin, err := bins.SandboxLibkrun(filepath.Join("..", "..", ".."), filepath.Join(dir, "bin"), adapter.AgentName(runtime.GOARCH), adapterFlags...)
	if err != nil {
		return e, err
	}
	e.bin = bin
	e.cacheDir = filepath.Join(dir, "cache")
	e.layout = layout
	// The store reads <cache>/oci; the real layout is only read.
	if err := dirs.ImageCache(e.cacheDir, layout); err != nil {
		return e, err
	}
	return e, nil
}

// envRace, when set, builds the adapter with the race detector, so these
// tests look for data races in the adapter under real VMs.
const envRace = "III_E2E_ADAPTER_RACE"

// layoutHas reports whether the OCI layout's index names ref.
func layoutHas(layout, ref string) bool {
	b, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		return false
	}
	var idx struct {
		Manifests []struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if json.Unmarshal(b, &idx) != nil {
		return false
	}
	for _, m := range idx.Manifests {
		if m.Annotations["org.opencontainers.image.ref.name"] == ref {
			return true
		}
	}
	return false
}

// needVMs skips a test that boots VMs when this host cannot.
func needVMs(t *testing.T) *env {
	t.Helper()
	if shared.skip != "" {
		t.Skip(shared.skip)
	}
	return &shared
}

// ctxT is a context for one call in a test.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

func itoa(n int) string { return fmt.Sprint(n) }

package adapter

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"go.uber.org/goleak"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
)

// vmEnv is what the tests that boot VMs need, built once by TestMain: the
// adapter binary (runners are started from it) with the guest agent beside
// it. skip says why VM tests cannot run here.
type vmEnv struct {
	exe  string
	skip string
}

// vms is set by TestMain before any test runs.
var vms vmEnv

func TestMain(m *testing.M) {
	flag.Parse()
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	switch {
	case testing.Short():
		vms.skip = "boots VMs; skipped with -short"
	case !haveQEMU():
		vms.skip = "QEMU or a guest kernel is missing (scripts/setup-vm.sh installs them)"
	default:
		dir, err := os.MkdirTemp("", "iii-adapter-test-")
		if err != nil {
			return 1, err
		}
		defer os.RemoveAll(dir)
		vms.exe = filepath.Join(dir, "sandbox-libkrun")
		if out, err := exec.Command("go", "build", "-o", vms.exe, "../cmd/sandbox-libkrun").CombinedOutput(); err != nil {
			return 1, fmt.Errorf("build the adapter: %v\n%s", err, out)
		}
		build := exec.Command("go", "build", "-o", filepath.Join(dir, AgentName(runtime.GOARCH)), "../cmd/iii-guest-agent")
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err := build.CombinedOutput(); err != nil {
			return 1, fmt.Errorf("build the guest agent: %v\n%s", err, out)
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			return 1, fmt.Errorf("goroutines leaked: %v", err)
		}
	}
	return code, nil
}

func haveQEMU() bool {
	if _, err := (&qemu.Config{}).Binary(); err != nil {
		return false
	}
	_, err := qemu.FindKernel("/boot", "/lib/modules", runtime.GOARCH)
	return err == nil
}

func needVMs(t *testing.T) string {
	t.Helper()
	if vms.skip != "" {
		t.Skip(vms.skip)
	}
	return vms.exe
}

package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
)

// The test binary doubles as the processes these tests need: a runner
// (with a fake back end that stands in for the VM) and an "adapter" that
// spawns one and then waits to be killed.
const (
	envSpawner = "III_RUNNER_TEST_SPAWNER"
	// envSleep makes the test binary a process that only sleeps, under
	// whatever command line the test gave it.
	envSleep = "III_RUNNER_TEST_SLEEP"
	// envGrace is the spawner's runner's adoption grace, in ms.
	envGrace = "III_RUNNER_TEST_GRACE_MS"
)

func TestMain(m *testing.M) {
	if os.Getenv(envSleep) != "" {
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == Subcommand {
		os.Exit(Main(os.Args[1:], []backend.Backend{fakeVM{}}))
	}
	if dir := os.Getenv(envSpawner); dir != "" {
		os.Exit(spawner(dir))
	}
	goleak.VerifyTestMain(m)
}

// fakeVM is a back end whose "VM" is the runner itself: it records that
// it started and how it ended, in files of the state directory.
type fakeVM struct{}

func (fakeVM) Name() string { return backend.QEMU }

func (fakeVM) Run(ctx context.Context, spec backend.Spec, started func(backend.Started)) error {
	started(backend.Started{VMPID: os.Getpid()})
	_ = os.WriteFile(filepath.Join(spec.StateDir, "vm-started"), nil, 0o600)
	if spec.Hostname == "poweroff" {
		return nil
	}
	<-ctx.Done()
	_ = os.WriteFile(filepath.Join(spec.StateDir, "vm-stopped"), []byte(context.Cause(ctx).Error()), 0o600)
	return ctx.Err()
}

// spawner is an adapter in miniature: it spawns a runner for dir, prints
// its pid and waits (to be killed).
func spawner(dir string) int {
	d, err := CreateDir(filepath.Dir(dir), filepath.Base(dir))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	cfg := testConfig(dir, "")
	if g := os.Getenv(envGrace); g != "" {
		if cfg.AdoptGraceMS, err = strconv.ParseUint(g, 10, 64); err != nil {
			fmt.Println("error:", err)
			return 1
		}
	}
	p, err := Spawn(context.Background(), SpawnOptions{Executable: os.Args[0], Dir: d, Config: cfg})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println(p.PID)
	time.Sleep(time.Hour)
	return 0
}

func testConfig(dir, hostname string) Config {
	return Config{Version: ConfigVersion, Backend: backend.QEMU, Spec: backend.Spec{
		ID: "test", CPUs: 1, MemoryMiB: 128, Kernel: "/boot/vmlinuz", Initrd: "/tmp/initrd",
		StateDir: dir, Accel: backend.AccelTCG, Hostname: hostname,
	}}
}

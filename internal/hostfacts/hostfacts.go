// Package hostfacts describes the machine a test run or an adapter runs on:
// whether /dev/kvm exists and can be opened, whether this host is itself a
// VM (so its KVM is nested), and the versions of the tools the tests use.
// It only looks; it never changes anything, so a test that exists to probe
// the real host can say what it found instead of failing.
package hostfacts

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// KVMState is what opening the KVM device showed.
type KVMState string

const (
	// KVMMissing: no device node (no module, no virtualization, or a /dev
	// that does not hold it).
	KVMMissing KVMState = "missing"
	// KVMNoAccess: the node exists but this user cannot open it read-write.
	KVMNoAccess KVMState = "no-access"
	// KVMNested: it opens, and this host is itself a VM. Whether a stock
	// kernel boots under it is only known by booting one (the QEMU probe):
	// nested PVM opens fine and then hangs the guest.
	KVMNested KVMState = "nested"
	// KVMPresent: it opens on a host that reports no hypervisor above it.
	KVMPresent KVMState = "present"
	// KVMNotLinux: the host has no KVM at all (macOS uses HVF).
	KVMNotLinux KVMState = "not-linux"
)

// KVM is the state of one KVM device.
type KVM struct {
	Device string
	State  KVMState
	// Detail says why, in words a person can act on.
	Detail string
}

func (k KVM) String() string { return string(k.State) + ": " + k.Detail }

// ProbeKVM looks at dev ("" means /dev/kvm) and /proc/cpuinfo.
func ProbeKVM(dev string) KVM {
	return probeKVM(dev, "/proc/cpuinfo", runtime.GOOS)
}

func probeKVM(dev, cpuinfo, goos string) KVM {
	if dev == "" {
		dev = "/dev/kvm"
	}
	k := KVM{Device: dev}
	if goos != "linux" {
		k.State, k.Detail = KVMNotLinux, "KVM is Linux's; "+goos+" uses its own hypervisor"
		return k
	}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		k.State, k.Detail = KVMMissing, dev+" does not exist"
		return k
	case err != nil:
		k.State, k.Detail = KVMNoAccess, err.Error()
		return k
	}
	_ = f.Close()
	if underHypervisor(cpuinfo) {
		k.State, k.Detail = KVMNested, dev+" opens read-write, and this host is itself a VM (cpuinfo flag hypervisor): only a boot shows whether it runs a stock kernel"
		return k
	}
	k.State, k.Detail = KVMPresent, dev+" opens read-write on a host with no hypervisor above it"
	return k
}

// underHypervisor reports the x86 "hypervisor" CPU flag, which a guest
// sees and bare metal does not.
func underHypervisor(cpuinfo string) bool {
	b, err := os.ReadFile(cpuinfo)
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "flags") {
			continue
		}
		_, flags, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		for _, f := range strings.Fields(flags) {
			if f == "hypervisor" {
				return true
			}
		}
		return false
	}
	return false
}

// Tool is one program the tests use and the first line of its version.
type Tool struct {
	Name    string
	Version string // "not installed" when it is not on PATH
}

// ToolVersion runs name with args and keeps the first line it prints; it
// gives up after a few seconds so a wedged tool cannot stall a report.
func ToolVersion(name string, args ...string) Tool {
	t := Tool{Name: name}
	path, err := exec.LookPath(name)
	if err != nil {
		t.Version = "not installed"
		return t
	}
	cmd := exec.Command(path, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Version = "cannot run: " + err.Error()
		return t
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Version = "did not answer within 10 s"
		return t
	}
	line, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
	if err != nil && line == "" {
		line = "failed: " + err.Error()
	}
	t.Version = strings.TrimSpace(line)
	return t
}

// User says who this process runs as.
func User() string {
	if os.Geteuid() == 0 {
		return "root"
	}
	return fmt.Sprintf("uid %d (not root)", os.Geteuid())
}

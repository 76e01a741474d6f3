// Command testenv prints the facts of the machine a test run used, so a
// failing `make test` says where it ran: KVM (missing, no access, nested,
// present), what the QEMU accelerator probe found in this run, whether it
// ran as root, and the versions of the tools the tests start.
//
//	go run ./scripts/testenv [-facts DIR]
//
// DIR is where tests that probe the real host left their findings
// (III_TEST_FACTS; the QEMU probe test writes qemu-probe.txt there).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"

	"github.com/iii-sandbox/iii/internal/hostfacts"
)

func main() {
	facts := flag.String("facts", os.Getenv("III_TEST_FACTS"), "directory where host-probing tests left their findings")
	root := flag.String("root", ".", "the repository root (for the pinned Node iii-sdk)")
	flag.Parse()
	report(os.Stdout, *facts, *root)
}

func report(out io.Writer, facts, root string) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "test environment:")
	row := func(k, v string) { fmt.Fprintf(w, "  %s\t%s\n", k, v) }
	row("host", fmt.Sprintf("%s/%s, kernel %s, %d cores, running as %s", runtime.GOOS, runtime.GOARCH, firstLine("/proc/sys/kernel/osrelease"), runtime.NumCPU(), hostfacts.User()))
	row("kvm", hostfacts.ProbeKVM("").String())
	if os.Getenv("III_IN_NOKVM_NS") == "1" {
		row("/dev", "a fresh tmpfs without kvm (scripts/test-nokvm.sh)")
	}
	row("qemu accel probe", probeFindings(facts))
	qemu := "qemu-system-x86_64"
	if runtime.GOARCH == "arm64" {
		qemu = "qemu-system-aarch64"
	}
	for _, t := range []hostfacts.Tool{
		hostfacts.ToolVersion("go", "version"),
		hostfacts.ToolVersion(qemu, "--version"),
		hostfacts.ToolVersion("node", "--version"),
		{Name: "iii-sdk (node)", Version: nodeSDKVersion(root)},
		hostfacts.ToolVersion("redis-server", "--version"),
		hostfacts.ToolVersion("protoc", "--version"),
	} {
		row(t.Name, t.Version)
	}
	_ = w.Flush()
}

// probeFindings is what the QEMU probe test recorded in this run, one
// accelerator a line.
func probeFindings(dir string) string {
	if dir == "" {
		return "not recorded (III_TEST_FACTS unset)"
	}
	b, err := os.ReadFile(filepath.Join(dir, "qemu-probe.txt"))
	if err != nil {
		return "not run in this run (the QEMU probe test was skipped or did not get that far)"
	}
	return strings.Join(strings.Fields(strings.ReplaceAll(string(bytes.TrimSpace(b)), "\n", "; ")), " ")
}

func nodeSDKVersion(root string) string {
	b, err := os.ReadFile(filepath.Join(root, "testdata", "nodesdk", "node_modules", "iii-sdk", "package.json"))
	if err != nil {
		return "not installed (make setup-test)"
	}
	var p struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(b, &p); err != nil || p.Version == "" {
		return "unreadable package.json"
	}
	return p.Version
}

func firstLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}

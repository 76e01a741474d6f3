// Package nodesdk gives tests and benchmarks the published Node SDK
// (iii-sdk, pinned in testdata/nodesdk and installed by make setup-test):
// it finds node and the SDK, runs a Node script that drives the SDK and
// prints JSON lines, and packs the SDK into the directory of a Node VM
// worker, whose install step (the embedded unpack.mjs) lays it out in the
// guest.
package nodesdk

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
)

// SDK is node on this host and the installed iii-sdk.
type SDK struct {
	// Node is the node binary.
	Node string
	// Modules is testdata/nodesdk/node_modules, the SDK and its
	// dependencies.
	Modules string
	// URL is the file URL of the SDK's ES module entry point: scripts
	// import it from III_SDK_URL, so they run from any directory.
	URL string
}

// ErrNotInstalled is wrapped by Modules' error when the repository is
// found but the SDK is not installed in it.
var ErrNotInstalled = errors.New("the Node SDK is not installed in testdata/nodesdk (make setup-test)")

// Modules returns the node_modules directory of the SDK installed in the
// repository that holds dir.
func Modules(dir string) (string, error) {
	root, err := bins.RepoRoot(dir)
	if err != nil {
		return "", err
	}
	mods := filepath.Join(root, "testdata", "nodesdk", "node_modules")
	if _, err := os.Stat(filepath.Join(mods, "iii-sdk", "package.json")); err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	return mods, nil
}

// ErrNoNode is wrapped by Locate's error when node is not on PATH.
var ErrNoNode = errors.New("node is not installed (make setup-test)")

// Locate finds node and the SDK installed in the repository that holds
// dir. Its error wraps ErrNoNode or ErrNotInstalled when something is not
// installed.
func Locate(dir string) (SDK, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return SDK{}, fmt.Errorf("%w: %v", ErrNoNode, err)
	}
	mods, err := Modules(dir)
	if err != nil {
		return SDK{}, err
	}
	entry := filepath.Join(mods, "iii-sdk", "dist", "index.mjs")
	if _, err := os.Stat(entry); err != nil {
		return SDK{}, fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	return SDK{Node: node, Modules: mods, URL: (&url.URL{Scheme: "file", Path: entry}).String()}, nil
}

// Find is Locate for the test's working directory. It skips the test when
// node or the SDK is not installed (an optional set-up step) and fails it
// when the repository is not found.
func Find(t testing.TB) SDK {
	t.Helper()
	sdk, err := Locate(workDir(t))
	if errors.Is(err, ErrNoNode) || errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return sdk
}

// FindModules is Modules for the test's working directory, skipping the
// test when the SDK is not installed: VM workers need the SDK's files but
// not node on the host.
func FindModules(t testing.TB) string {
	t.Helper()
	mods, err := Modules(workDir(t))
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return mods
}

func workDir(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

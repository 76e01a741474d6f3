// Package dirs makes the directories tests and benchmarks need that
// t.TempDir does not give: ones with short paths, image caches that read
// the local OCI layout, and listings of what a directory holds.
package dirs

import (
	"os"
	"path/filepath"
	"testing"
)

// Short makes a directory directly under /tmp, removed when the test ends.
// VM state directories hold unix sockets, whose paths must fit in about
// a hundred bytes; t.TempDir's paths (test name included) often do not.
func Short(t testing.TB, prefix string) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// Names lists the names in dir, in directory order; a missing dir is
// empty rather than an error, because tests ask "nothing left behind?".
func Names(t testing.TB, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	return out
}

// ImageCache makes dir a sandbox-libkrun image cache (its cache_dir) whose
// presets come from the OCI layout at layout (the one
// scripts/build-images.sh fills): dir/oci links to it. The adapter only
// reads the layout, so a test's cache may share the real one.
func ImageCache(dir, layout string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Symlink(layout, filepath.Join(dir, "oci"))
}

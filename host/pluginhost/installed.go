package pluginhost

import (
	"github.com/iii-sandbox/iii/contract"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Installed lists, sorted and without repeats, the adapters installed where
// Find looks: executables in ~/.iii/plugins (every one there is an
// adapter), and those named sandbox-* on $III_PLUGIN_PATH, beside the
// running iii executable and in Compose's package cache. The engine
// protects these names (docs/security.md, Adapter names) before any worker
// connects, so no worker takes an installed adapter's functions while it is
// not running yet.
func (f Finder) Installed() []string {
	var out []string
	add := func(name string, any bool) {
		if contract.ValidAdapterName(name) && (any || strings.HasPrefix(name, "sandbox-")) {
			out = append(out, name)
		}
	}
	scan := func(dir string, any bool) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.IsDir() || executableFile(filepath.Join(dir, e.Name())) != nil {
				continue
			}
			add(e.Name(), any)
		}
	}
	home, homeErr := f.home()
	if homeErr == nil {
		scan(filepath.Join(home, ".iii", "plugins"), true)
	}
	for _, d := range filepath.SplitList(f.getenv(EnvPluginPath)) {
		if d != "" && filepath.IsAbs(d) {
			scan(d, false)
		}
	}
	if exe, err := f.executable(); err == nil {
		if resolved, err := filepath.EvalSymlinks(exe); err == nil {
			exe = resolved
		}
		scan(filepath.Dir(exe), false)
	}
	cache := ""
	if d := f.getenv(EnvComposeStateDir); d != "" {
		cache = filepath.Join(d, "packages")
	} else if homeErr == nil {
		cache = filepath.Join(home, ".iii", "compose", "packages")
	}
	if entries, err := os.ReadDir(cache); cache != "" && err == nil {
		for _, e := range entries {
			// <name>-<version>-<target>: the name is what precedes the
			// first "-<digit>".
			n := e.Name()
			for i := 0; i+1 < len(n); i++ {
				if n[i] == '-' && n[i+1] >= '0' && n[i+1] <= '9' {
					add(n[:i], false)
					break
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Installed is the host's Finder's Installed.
func (h *Host) Installed() []string { return h.opts.Finder.Installed() }

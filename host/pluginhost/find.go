package pluginhost

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
)

// Environment variables discovery reads.
const (
	// EnvPluginPath is a list of directories (like PATH) searched for
	// adapter binaries.
	EnvPluginPath = "III_PLUGIN_PATH"
	// EnvComposeStateDir moves Compose's state, and with it the package
	// cache at <dir>/packages.
	EnvComposeStateDir = "III_COMPOSE_STATE_DIR"
)

// packageSearchDepth is how deep inside a package cache entry the
// adapter's executable may sit (entry/name, entry/bin/name, ...); Compose
// unpacks archives that nest the binary up to this deep.
const packageSearchDepth = 3

// Finder locates an adapter binary by name. The zero value searches the
// real environment; tests set the functions.
type Finder struct {
	// Getenv reads an environment variable; nil means os.Getenv.
	Getenv func(string) string
	// HomeDir is the user's home; nil means os.UserHomeDir.
	HomeDir func() (string, error)
	// Executable is the running iii binary; nil means os.Executable.
	Executable func() (string, error)
	// GOOS and GOARCH select the package cache's target; empty means this
	// build's.
	GOOS, GOARCH string
}

// NotFoundError says where an adapter was looked for.
type NotFoundError struct {
	Adapter  string
	Searched []string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("no executable for sandbox adapter %q in any of: %s; install the adapter (Compose puts it in its package cache),"+
		" put the binary in ~/.iii/plugins/ or a directory on $%s, or pass its path",
		e.Adapter, strings.Join(e.Searched, ", "), EnvPluginPath)
}

func (f Finder) getenv(k string) string {
	if f.Getenv != nil {
		return f.Getenv(k)
	}
	return os.Getenv(k)
}

func (f Finder) home() (string, error) {
	if f.HomeDir != nil {
		return f.HomeDir()
	}
	return os.UserHomeDir()
}

func (f Finder) executable() (string, error) {
	if f.Executable != nil {
		return f.Executable()
	}
	return os.Executable()
}

// Find returns the adapter binary to run. An explicit path is used as it
// is (it must be an executable file). Otherwise, in this order:
//
//  1. Compose's package cache ($III_COMPOSE_STATE_DIR/packages, else
//     ~/.iii/compose/packages): among the entries <name>-<version>-<target>
//     built for this host, the highest version holding an executable named
//     <name> (at most three levels down);
//  2. ~/.iii/plugins/<name>;
//  3. <dir>/<name> for each directory of $III_PLUGIN_PATH, in order;
//  4. <name> beside the running iii executable.
func (f Finder) Find(name, explicit string) (string, error) {
	if explicit != "" {
		if !filepath.IsAbs(explicit) {
			return "", fmt.Errorf("adapter path %q must be absolute", explicit)
		}
		if err := executableFile(explicit); err != nil {
			return "", fmt.Errorf("adapter path %s: %w", explicit, err)
		}
		return explicit, nil
	}
	var searched []string
	home, homeErr := f.home()

	cache := ""
	if d := f.getenv(EnvComposeStateDir); d != "" {
		cache = filepath.Join(d, "packages")
	} else if homeErr == nil {
		cache = filepath.Join(home, ".iii", "compose", "packages")
	}
	if cache != "" {
		searched = append(searched, filepath.Join(cache, name+"-<version>-"+strings.Join(hostTargets(f.goos(), f.goarch()), "|")))
		if p := f.fromPackages(cache, name); p != "" {
			return p, nil
		}
	}

	var dirs []string
	if homeErr == nil {
		dirs = append(dirs, filepath.Join(home, ".iii", "plugins"))
	}
	for _, d := range filepath.SplitList(f.getenv(EnvPluginPath)) {
		// Relative entries would depend on the engine's working
		// directory; like PATH lookups for privileged programs, skip them.
		if d != "" && filepath.IsAbs(d) {
			dirs = append(dirs, d)
		}
	}
	if exe, err := f.executable(); err == nil {
		if resolved, err := filepath.EvalSymlinks(exe); err == nil {
			exe = resolved
		}
		dirs = append(dirs, filepath.Dir(exe))
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		searched = append(searched, p)
		if executableFile(p) == nil {
			return p, nil
		}
	}
	return "", &NotFoundError{Adapter: name, Searched: searched}
}

func (f Finder) goos() string {
	if f.GOOS != "" {
		return f.GOOS
	}
	return runtime.GOOS
}

func (f Finder) goarch() string {
	if f.GOARCH != "" {
		return f.GOARCH
	}
	return runtime.GOARCH
}

// hostTargets are the package targets (Rust-style triples, as Compose
// names cache entries) whose binaries run on goos/goarch. Go adapters are
// static, so a musl build runs on a glibc Linux and the reverse.
func hostTargets(goos, goarch string) []string {
	arch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[goarch]
	if arch == "" {
		return nil
	}
	switch goos {
	case "linux":
		return []string{arch + "-unknown-linux-gnu", arch + "-unknown-linux-musl"}
	case "darwin":
		return []string{arch + "-apple-darwin"}
	}
	return nil
}

// fromPackages picks the highest version of name in the package cache
// that holds its executable; "" when there is none.
func (f Finder) fromPackages(cache, name string) string {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return ""
	}
	targets := hostTargets(f.goos(), f.goarch())
	type found struct {
		v    *semver.Version
		dir  string
		path string
	}
	var all []found
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		v, ok := parsePackageDir(e.Name(), name, targets)
		if !ok {
			continue
		}
		dir := filepath.Join(cache, e.Name())
		if p := findExecutable(dir, name, packageSearchDepth); p != "" {
			all = append(all, found{v, e.Name(), p})
		}
	}
	if len(all) == 0 {
		return ""
	}
	best := slices.MaxFunc(all, func(a, b found) int {
		if c := a.v.Compare(b.v); c != 0 {
			return c
		}
		return strings.Compare(a.dir, b.dir)
	})
	return best.path
}

// parsePackageDir reads a package cache entry name <name>-<version>-<target>
// for one of targets. The version is whatever lies between, and must be a
// semantic version (a prerelease such as 0.3.0-rc.1 is fine: the target,
// known in advance, is cut off first).
func parsePackageDir(dir, name string, targets []string) (*semver.Version, bool) {
	rest, ok := strings.CutPrefix(dir, name+"-")
	if !ok {
		return nil, false
	}
	for _, t := range targets {
		ver, ok := strings.CutSuffix(rest, "-"+t)
		if !ok || ver == "" {
			continue
		}
		v, err := semver.NewVersion(ver)
		if err != nil {
			return nil, false
		}
		return v, true
	}
	return nil, false
}

// findExecutable looks for an executable file called name in dir and its
// subdirectories down to depth levels, shallowest first and in name order,
// so the choice is deterministic.
func findExecutable(dir, name string, depth int) string {
	level := []string{dir}
	for range depth {
		var next []string
		for _, d := range level {
			p := filepath.Join(d, name)
			if executableFile(p) == nil {
				return p
			}
			entries, err := os.ReadDir(d)
			if err != nil {
				continue
			}
			for _, e := range entries {
				if e.IsDir() {
					next = append(next, filepath.Join(d, e.Name()))
				}
			}
		}
		level = next
	}
	return ""
}

var errNotExecutable = errors.New("not an executable file")

// executableFile checks p is a regular file (after symlinks) that some
// user may execute.
func executableFile(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%w (mode %s)", errNotExecutable, st.Mode())
	}
	return nil
}

package registry

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/iii-sandbox/iii/compose"
)

// Platform is what a host runs: it selects the artefact (by Rust target
// triple) and refuses what cannot run here.
type Platform struct {
	GOOS, GOARCH string
	// Musl is a Linux whose C library is musl (Alpine): it needs
	// *-unknown-linux-musl artefacts.
	Musl bool
}

// HostPlatform is the platform iii runs on, with musl detected from the
// dynamic loaders present.
func HostPlatform() Platform {
	p := Platform{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH}
	if p.GOOS == "linux" {
		p.Musl = detectMusl(func(pattern string) bool {
			m, _ := filepath.Glob(pattern)
			return len(m) > 0
		})
	}
	return p
}

// detectMusl reports a musl Linux: its loader /lib/ld-musl-<arch>.so.1 is
// there and no glibc loader is (a glibc host with musl installed beside
// it stays glibc).
func detectMusl(exists func(pattern string) bool) bool {
	if !exists("/lib/ld-musl-*.so.1") {
		return false
	}
	for _, glibc := range []string{"/lib64/ld-linux-*.so.*", "/lib/ld-linux-*.so.*", "/lib/*-linux-gnu/ld-linux-*.so.*"} {
		if exists(glibc) {
			return false
		}
	}
	return true
}

// Target is the Rust target triple of the platform, the key of a
// version's artefacts.
func (p Platform) Target() string {
	arch := map[string]string{"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "riscv64": "riscv64gc", "ppc64le": "powerpc64le", "s390x": "s390x"}[p.GOARCH]
	if arch == "" {
		arch = p.GOARCH
	}
	switch p.GOOS {
	case "linux":
		if p.Musl {
			return arch + "-unknown-linux-musl"
		}
		return arch + "-unknown-linux-gnu"
	case "darwin":
		return arch + "-apple-darwin"
	case "windows":
		return arch + "-pc-windows-msvc"
	case "freebsd":
		return arch + "-unknown-freebsd"
	}
	return arch + "-unknown-" + p.GOOS
}

// IsWindows reports a Windows host: it has no VM, so bundles are refused
// there before anything is downloaded.
func (p Platform) IsWindows() bool { return p.GOOS == "windows" }

// EnvBundlesDisabled set to 1 refuses bundle workers on any host.
const EnvBundlesDisabled = "III_BUNDLE_WORKERS_DISABLED"

// Installable checks that a resolved version can be installed on p and
// returns the target triple to download. It runs before any download:
// engine-kind packages are built into the engine (ENGINE_WORKER_IS_BUILTIN),
// images need an OCI runtime (UNSUPPORTED_PACKAGE_KIND), bundles need a VM
// (BUNDLE_NEEDS_A_VM on Windows and when bundles are disabled), and a
// version without an artefact for the host is UNSUPPORTED_PLATFORM,
// listing the targets it ships.
func Installable(name, version, kind string, targets []string, p Platform, bundlesDisabled bool) (string, error) {
	switch kind {
	case KindEngine:
		return "", compose.New(compose.CodeEngineWorkerIsBuiltin, fmt.Sprintf(
			"%s %s is built into the engine (kind engine) and has nothing to install; configure it under engine.workers instead of declaring it as a container", name, version))
	case KindImage:
		return "", compose.New(compose.CodeUnsupportedPackageKind, fmt.Sprintf(
			"%s %s is an image package, which needs an OCI runtime that Compose does not have; use a binary or bundle package, or a path:// worker", name, version))
	case KindBinary, KindBundle:
	default:
		return "", compose.New(compose.CodeUnsupportedPackageKind, fmt.Sprintf("%s %s has kind %q, which Compose cannot run", name, version, clip(kind, 40)))
	}
	if kind == KindBundle && p.IsWindows() {
		return "", compose.New(compose.CodeBundleNeedsAVM, fmt.Sprintf(
			"%s %s is a bundle, which needs a VM (runtime: host too), and Windows has none; nothing was downloaded. Run Compose under WSL", name, version))
	}
	if kind == KindBundle && bundlesDisabled {
		return "", compose.New(compose.CodeBundleNeedsAVM, fmt.Sprintf(
			"%s %s is a bundle and $%s=1 refuses bundle workers on this machine; nothing was downloaded. Unset it, or use a binary package or a path:// worker", name, version, EnvBundlesDisabled))
	}
	target := p.Target()
	for _, t := range targets {
		if t == target {
			return target, nil
		}
	}
	ships := "no target at all"
	if len(targets) > 0 {
		ships = strings.Join(targets, ", ")
	}
	return "", compose.New(compose.CodeUnsupportedPlatform, fmt.Sprintf(
		"%s %s has no artefact for this host (%s); it ships %s", name, version, target, ships))
}

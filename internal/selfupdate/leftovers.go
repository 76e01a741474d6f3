package selfupdate

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Leftover is a file or directory iii 0.25 left that 0.26 never reads.
type Leftover struct {
	Path  string
	IsDir bool
}

// Leftovers is what FindLeftovers found. Nothing in it is ever deleted by
// this package: the user removes it after reading the upgrade guide.
type Leftovers struct {
	// Binaries are iii-worker and iii-init beside iii and in ~/.local/bin.
	Binaries []Leftover
	// State is 0.25's VM state under ~/.iii (docs/upgrading-to-0.26.md,
	// "Clean up VM state").
	State []Leftover
}

// Empty reports that nothing was found.
func (l Leftovers) Empty() bool { return len(l.Binaries) == 0 && len(l.State) == 0 }

// leftoverBinaries are the 0.25 binaries that 0.26 no longer ships.
func leftoverBinaries() []string { return []string{"iii-worker", "iii-init"} }

// leftoverState are the paths under the home directory that iii-worker
// (and releases before 0.25) wrote and sandbox-libkrun never reads. The
// rest of ~/.iii/lib/ (libkrun, the guest agent) and of ~/.iii/cache/
// (pulled images) is still used and is deliberately not listed.
func leftoverState() []string {
	return []string{
		".iii/managed",
		".iii/workers",
		".iii/workers-bundle",
		".iii/cache/bundles",
		".iii/logs",
		".iii/pids",
		".iii/lib/iii-init",
		".iii/rootfs",
		".iii/images",
	}
}

// FindLeftovers looks for the 0.25 binaries in exeDir (where iii is) and
// home/.local/bin, and for 0.25 state under home. It only stats paths
// (symlinks are not followed); an empty home skips what lives there.
func FindLeftovers(exeDir, home string) Leftovers {
	var out Leftovers
	dirs := []string{exeDir}
	if home != "" {
		local := filepath.Join(home, ".local", "bin")
		if !sameDir(local, exeDir) {
			dirs = append(dirs, local)
		}
	}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		for _, name := range leftoverBinaries() {
			if runtime.GOOS == "windows" {
				name += ".exe"
			}
			p := filepath.Join(d, name)
			if st, err := os.Lstat(p); err == nil && !st.IsDir() {
				out.Binaries = append(out.Binaries, Leftover{Path: p})
			}
		}
	}
	if home == "" {
		return out
	}
	for _, rel := range leftoverState() {
		p := filepath.Join(home, filepath.FromSlash(rel))
		if st, err := os.Lstat(p); err == nil {
			out.State = append(out.State, Leftover{Path: p, IsDir: st.IsDir()})
		}
	}
	return out
}

// sameDir reports two names of one directory (one may be a symlink to
// the other).
func sameDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// PathCheck says whether the shell runs the iii that was updated.
type PathCheck struct {
	// OnPath is the iii the PATH finds first (`command -v iii`); "" when
	// none.
	OnPath string
	// Differs: OnPath is another file than the updated iii, so
	// `iii --version` keeps printing the old version.
	Differs bool
	// Homebrew: OnPath is a Homebrew install, updated with `brew upgrade
	// iii`.
	Homebrew bool
}

// CheckPath compares exe with the first iii on pathEnv.
func CheckPath(exe, pathEnv string) PathCheck {
	onPath := LookPath("iii", pathEnv)
	if onPath == "" {
		return PathCheck{}
	}
	pc := PathCheck{OnPath: onPath}
	a, errA := os.Stat(onPath)
	b, errB := os.Stat(exe)
	pc.Differs = errA != nil || errB != nil || !os.SameFile(a, b)
	if pc.Differs {
		pc.Homebrew = isHomebrew(onPath)
		if real, err := filepath.EvalSymlinks(onPath); err == nil && !pc.Homebrew {
			pc.Homebrew = isHomebrew(real)
		}
	}
	return pc
}

// isHomebrew recognises Homebrew's prefixes (Apple silicon, Intel macOS,
// Linux) and its Cellar.
func isHomebrew(p string) bool {
	p = filepath.ToSlash(p)
	for _, prefix := range []string{"/opt/homebrew/", "/usr/local/Homebrew/", "/usr/local/Cellar/", "/home/linuxbrew/.linuxbrew/"} {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return strings.Contains(p, "/Cellar/")
}

// LookPath is `command -v name` over pathEnv: the first executable
// regular file named name in its directories; "" when none. Empty
// entries (the current directory) are skipped, as a shell that finds iii
// there would not be the installed one anyway.
func LookPath(name, pathEnv string) string {
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			continue
		}
		p := filepath.Join(d, name)
		if runtime.GOOS == "windows" {
			p += ".exe"
		}
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && (runtime.GOOS == "windows" || st.Mode().Perm()&0o111 != 0) {
			return p
		}
	}
	return ""
}

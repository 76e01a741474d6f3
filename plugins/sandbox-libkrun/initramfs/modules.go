package initramfs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// DefaultModules are the modules a sandbox VM needs on the QEMU back end
// (microvm on x86_64, virt on arm64, both with virtio-mmio devices): the
// transport, the console port, the block root, networking, overlayfs,
// erofs, and ext4 for a worker VM's persistent upper disk. Dependencies
// (virtio, virtio_ring, failover, libcrc32c, jbd2, ...) come from
// modules.dep; modules a kernel has built in are skipped.
func DefaultModules() []string {
	return []string{"virtio_mmio", "virtio_console", "virtio_blk", "virtio_net", "overlay", "erofs", "ext4"}
}

// ModuleDB is a kernel's module index: where each module file is and what
// it depends on.
type ModuleDB struct {
	Dir     string              // /lib/modules/<version>
	path    map[string]string   // module name → path relative to Dir
	deps    map[string][]string // module name → direct and indirect dependencies
	builtin map[string]bool
}

// ModuleName normalises a module file name or module name: the base name
// without .ko and compression suffixes, with "-" as "_" (the kernel treats
// both the same).
func ModuleName(p string) string {
	n := path.Base(p)
	for _, suf := range []string{".xz", ".zst", ".gz"} {
		n = strings.TrimSuffix(n, suf)
	}
	n = strings.TrimSuffix(n, ".ko")
	return strings.ReplaceAll(n, "-", "_")
}

// ParseModulesDep parses modules.dep: one "path: dep dep ..." line per
// module, paths relative to the modules directory.
func ParseModulesDep(r io.Reader) (map[string][]string, error) {
	out := map[string][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		mod, rest, ok := strings.Cut(line, ":")
		mod = strings.TrimSpace(mod)
		if !ok || mod == "" || strings.ContainsAny(mod, " \t") {
			return nil, fmt.Errorf("modules.dep line %d: want \"module.ko: deps...\"", n)
		}
		if _, dup := out[mod]; dup {
			return nil, fmt.Errorf("modules.dep line %d: %s listed twice", n, mod)
		}
		deps := strings.Fields(rest)
		if deps == nil {
			deps = []string{}
		}
		out[mod] = deps
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("modules.dep: %w", err)
	}
	return out, nil
}

// LoadModuleDB reads modules.dep (and modules.builtin when present) from a
// kernel's module directory.
func LoadModuleDB(dir string) (*ModuleDB, error) {
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("kernel modules index: %w (is the kernel package installed? scripts/setup-vm.sh installs one)", err)
	}
	defer f.Close()
	dep, err := ParseModulesDep(f)
	if err != nil {
		return nil, err
	}
	var builtin []string
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		builtin = strings.Fields(string(b))
	}
	return NewModuleDB(dir, dep, builtin)
}

// NewModuleDB indexes a parsed modules.dep.
func NewModuleDB(dir string, dep map[string][]string, builtin []string) (*ModuleDB, error) {
	db := &ModuleDB{Dir: dir, path: map[string]string{}, deps: map[string][]string{}, builtin: map[string]bool{}}
	for p := range dep {
		name := ModuleName(p)
		if prev, ok := db.path[name]; ok && prev != p {
			return nil, fmt.Errorf("modules.dep: module %s is both %s and %s", name, prev, p)
		}
		db.path[name] = p
	}
	for p, ds := range dep {
		names := make([]string, 0, len(ds))
		for _, d := range ds {
			names = append(names, ModuleName(d))
		}
		db.deps[ModuleName(p)] = names
	}
	for _, b := range builtin {
		db.builtin[ModuleName(b)] = true
	}
	return db, nil
}

// Path returns the file of a module relative to Dir.
func (db *ModuleDB) Path(name string) (string, bool) {
	p, ok := db.path[ModuleName(name)]
	return p, ok
}

// Resolve returns the module files (relative to Dir) to load for names, in
// an order where every module comes after its dependencies. Built-in
// modules are skipped; an unknown module is an error.
func (db *ModuleDB) Resolve(names []string) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var order []string
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("modules.dep: dependency cycle %s", strings.Join(append(chain, name), " → "))
		}
		p, ok := db.path[name]
		if !ok {
			if db.builtin[name] {
				state[name] = done
				return nil
			}
			if len(chain) > 0 {
				return fmt.Errorf("module %s (needed by %s) is not in %s/modules.dep", name, chain[len(chain)-1], db.Dir)
			}
			return fmt.Errorf("module %s is neither in %s/modules.dep nor built in", name, db.Dir)
		}
		state[name] = visiting
		deps := db.deps[name]
		// modules.dep lists the deepest dependencies last; loading in
		// reverse listing order is what modprobe does, and keeps the
		// result stable.
		for i := len(deps) - 1; i >= 0; i-- {
			if err := visit(deps[i], append(chain, name)); err != nil {
				return err
			}
		}
		state[name] = done
		order = append(order, p)
		return nil
	}
	for _, n := range names {
		if err := visit(ModuleName(n), nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

//go:build linux || darwin

package libkrun

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"unsafe"

	"github.com/ebitengine/purego"
)

// EnvPath names the environment variable that points at the library.
const EnvPath = "III_LIBKRUN_PATH"

// Options says where Open looks for libkrun.
type Options struct {
	// Path is the adapter config's libkrun_path. When set, it is the
	// only place tried.
	Path string
	// Getenv reads EnvPath (consulted when Path is empty); nil means
	// os.Getenv.
	Getenv func(string) string
	// Home is the user's home directory, for ~/.iii/lib; empty means
	// os.UserHomeDir().
	Home string
	// Dirs replaces the usual directories (DefaultDirs) when not nil.
	Dirs []string
	// SkipLoader leaves out asking the dynamic loader by bare name
	// (tests use it so a library installed on the machine cannot answer).
	SkipLoader bool
}

// Names returns the library file names to try for an OS, most specific
// first: the stable 1.x ABI soname, then the development link.
func Names(goos string) []string {
	if goos == "darwin" {
		return []string{"libkrun.1.dylib", "libkrun.dylib"}
	}
	return []string{"libkrun.so.1", "libkrun.so"}
}

// DefaultDirs are the directories searched besides ~/.iii/lib and the
// dynamic loader's own search. libkrun's Makefile installs into lib64 on
// Linux and lib on macOS; Homebrew on Apple silicon uses /opt/homebrew.
func DefaultDirs(goos string) []string {
	dirs := []string{"/usr/local/lib", "/usr/local/lib64", "/usr/lib64", "/usr/lib", "/lib"}
	if goos == "darwin" {
		dirs = append([]string{"/opt/homebrew/lib"}, dirs...)
	}
	return dirs
}

// candidate is one place Open tries.
type candidate struct {
	label string // what the error report shows
	path  string // what dlopen gets
	file  bool   // path is a file path (checked with stat first)
}

// candidates lists, in order, every place Open tries when no explicit path
// is set: each name (versioned first) in ~/.iii/lib, through the dynamic
// loader, then in each usual directory.
func candidates(opts Options, goos string) []candidate {
	home := opts.Home
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	dirs := opts.Dirs
	if dirs == nil {
		dirs = DefaultDirs(goos)
	}
	loader := "dynamic loader search (LD_LIBRARY_PATH, /etc/ld.so.cache, system directories)"
	if goos == "darwin" {
		loader = "dynamic loader search (DYLD_LIBRARY_PATH, DYLD_FALLBACK_LIBRARY_PATH, /usr/local/lib, /usr/lib)"
	}
	var out []candidate
	for _, name := range Names(goos) {
		if home != "" {
			p := filepath.Join(home, ".iii", "lib", name)
			out = append(out, candidate{label: p, path: p, file: true})
		}
		if !opts.SkipLoader {
			out = append(out, candidate{label: loader + " for " + name, path: name})
		}
		for _, d := range dirs {
			p := filepath.Join(d, name)
			out = append(out, candidate{label: p, path: p, file: true})
		}
	}
	return out
}

// Lib is a loaded libkrun. Its methods are safe to call from one goroutine
// at a time; a runner process uses one Lib for its one VM.
type Lib struct {
	path    string
	handle  uintptr
	table   []Symbol
	present map[string]bool
	fn      funcs
}

// funcs holds one Go function per bound C symbol; a nil field is a symbol
// the library lacks. char* parameters are *byte so NULL can be passed
// (purego turns a Go string "" into a pointer to a NUL byte, not NULL);
// char** parameters are unsafe.Pointer to a NULL-terminated array.
type funcs struct {
	createCtx          func() int32
	freeCtx            func(ctx uint32) int32
	setVMConfig        func(ctx uint32, vcpus uint8, ramMiB uint32) int32
	startEnter         func(ctx uint32) int32
	setLogLevel        func(level uint32) int32
	initLog            func(fd int32, level, style, options uint32) int32
	setEnv             func(ctx uint32, envp unsafe.Pointer) int32
	getShutdownEventfd func(ctx uint32) int32
	addDisk            func(ctx uint32, blockID, path *byte, readOnly bool) int32
	addDisk2           func(ctx uint32, blockID, path *byte, format uint32, readOnly bool) int32
	setKernel          func(ctx uint32, path *byte, format uint32, initramfs, cmdline *byte) int32
	checkNestedVirt    func() int32
	addNetUnixstream   func(ctx uint32, path *byte, fd int32, mac *byte, features, flags uint32) int32
	disableConsole     func(ctx uint32) int32
	addSerialConsole   func(ctx uint32, inFD, outFD int32) int32
	getMaxVCPUs        func() int32
	addConsoleMulti    func(ctx uint32) int32
	addConsolePortIO   func(ctx, consoleID uint32, name *byte, inFD, outFD int32) int32
	disableVsock       func(ctx uint32) int32
	hasFeature         func(feature uint64) int32
}

// targets maps each symbol name to the field its binding fills.
func (l *Lib) targets() map[string]any {
	f := &l.fn
	return map[string]any{
		"krun_create_ctx":                   &f.createCtx,
		"krun_free_ctx":                     &f.freeCtx,
		"krun_set_vm_config":                &f.setVMConfig,
		"krun_start_enter":                  &f.startEnter,
		"krun_set_log_level":                &f.setLogLevel,
		"krun_init_log":                     &f.initLog,
		"krun_set_env":                      &f.setEnv,
		"krun_get_shutdown_eventfd":         &f.getShutdownEventfd,
		"krun_add_disk":                     &f.addDisk,
		"krun_add_disk2":                    &f.addDisk2,
		"krun_set_kernel":                   &f.setKernel,
		"krun_check_nested_virt":            &f.checkNestedVirt,
		"krun_add_net_unixstream":           &f.addNetUnixstream,
		"krun_disable_implicit_console":     &f.disableConsole,
		"krun_add_serial_console_default":   &f.addSerialConsole,
		"krun_get_max_vcpus":                &f.getMaxVCPUs,
		"krun_add_virtio_console_multiport": &f.addConsoleMulti,
		"krun_add_console_port_inout":       &f.addConsolePortIO,
		"krun_disable_implicit_vsock":       &f.disableVsock,
		"krun_has_feature":                  &f.hasFeature,
	}
}

// Open finds and loads libkrun. The explicit path (Options.Path, else
// $III_LIBKRUN_PATH) is the only place tried when set; otherwise the
// versioned and then the unversioned name are tried in ~/.iii/lib, through
// the dynamic loader and in the usual directories. Nothing is found: an
// *Error with CodeNotFound listing every place and how to install libkrun.
func Open(opts Options) (*Lib, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	explicit, source := opts.Path, "libkrun_path"
	if explicit == "" {
		explicit, source = getenv(EnvPath), EnvPath
	}
	if explicit != "" {
		return openExplicit(explicit, source)
	}
	var tried []string
	var loadFailed, symbolFailed bool
	for _, c := range candidates(opts, runtime.GOOS) {
		if c.file {
			if _, err := os.Stat(c.path); err != nil {
				tried = append(tried, c.label+": "+statReason(err))
				continue
			}
		}
		h, err := dlopen(c.path)
		if err != nil {
			tried = append(tried, c.label+": "+err.Error())
			loadFailed = loadFailed || c.file
			continue
		}
		lib, err := bind(c.path, h, Symbols())
		if err != nil {
			tried = append(tried, c.label+": "+err.Error())
			symbolFailed = true
			continue
		}
		return lib, nil
	}
	switch {
	case symbolFailed:
		return nil, &Error{Code: CodeSymbol, Message: "a library named libkrun was found but lacks a required symbol: " + installHint(runtime.GOOS), Tried: tried}
	case loadFailed:
		return nil, &Error{Code: CodeLoad, Message: "a libkrun file was found but could not be loaded: " + installHint(runtime.GOOS), Tried: tried}
	}
	return nil, &Error{Code: CodeNotFound, Message: "libkrun was not found: " + installHint(runtime.GOOS), Tried: tried}
}

func openExplicit(p, source string) (*Lib, error) {
	label := p + " (from " + source + ")"
	if _, err := os.Stat(p); err != nil {
		return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("%s points at %s, which cannot be used: %s", source, p, installHint(runtime.GOOS)),
			Tried: []string{label + ": " + statReason(err)}}
	}
	h, err := dlopen(p)
	if err != nil {
		return nil, &Error{Code: CodeLoad, Message: fmt.Sprintf("%s points at %s, which the dynamic loader refused (not a shared library, or built for another architecture)", source, p),
			Tried: []string{label + ": " + err.Error()}}
	}
	lib, err := bind(p, h, Symbols())
	if err != nil {
		return nil, &Error{Code: CodeSymbol, Message: fmt.Sprintf("%s points at %s: %v", source, p, err), Tried: []string{label}}
	}
	return lib, nil
}

func statReason(err error) string {
	if errors.Is(err, os.ErrNotExist) {
		return "no such file"
	}
	return err.Error()
}

// dlopen loads a library. RTLD_NOW makes a library with unresolvable
// dependencies fail here, with the loader's message, rather than at the
// first call; RTLD_LOCAL keeps its symbols out of the global namespace.
func dlopen(p string) (uintptr, error) {
	return purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

// bind looks every symbol of the table up on its own, so a library that
// lacks optional ones still loads. A missing required symbol is an error
// and the handle is closed.
func bind(p string, h uintptr, table []Symbol) (*Lib, error) {
	l := &Lib{path: p, handle: h, table: table, present: map[string]bool{}}
	targets := l.targets()
	var missing []string
	for _, s := range table {
		addr, err := purego.Dlsym(h, s.Name)
		if err != nil || addr == 0 {
			if s.Required {
				missing = append(missing, s.Name)
			}
			continue
		}
		target, ok := targets[s.Name]
		if !ok {
			_ = purego.Dlclose(h)
			return nil, fmt.Errorf("symbol %s has no binding", s.Name)
		}
		if err := register(target, addr); err != nil {
			_ = purego.Dlclose(h)
			return nil, fmt.Errorf("bind %s: %w", s.Name, err)
		}
		l.present[s.Name] = true
	}
	if len(missing) > 0 {
		_ = purego.Dlclose(h)
		return nil, fmt.Errorf("required symbols missing: %v", missing)
	}
	return l, nil
}

// register wraps purego.RegisterFunc, which panics on a function type it
// cannot map; that is a bug here, but it must not take the adapter down.
func register(fptr any, addr uintptr) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("purego: %v", r)
		}
	}()
	purego.RegisterFunc(fptr, addr)
	return nil
}

// Path is the file the library was loaded from (or the bare name the
// dynamic loader resolved).
func (l *Lib) Path() string { return l.path }

// Has reports whether the library exports a symbol of the table.
func (l *Lib) Has(name string) bool { return l.present[name] }

// Missing lists the table's optional symbols the library lacks, sorted.
func (l *Lib) Missing() []string {
	out := []string{}
	for _, s := range l.table {
		if !l.present[s.Name] {
			out = append(out, s.Name)
		}
	}
	sort.Strings(out)
	return out
}

// MinVersion is the oldest libkrun release that has every symbol found.
func (l *Lib) MinVersion() (Version, bool) {
	var present []string
	for name := range l.present {
		present = append(present, name)
	}
	return InferMinVersion(l.table, present)
}

// Close unloads the library. Never call it after Boot entered the VM.
func (l *Lib) Close() error {
	if l.handle == 0 {
		return nil
	}
	err := purego.Dlclose(l.handle)
	// The bound functions point into the unloaded code: forget them so a
	// later call fails as a missing symbol instead of jumping into it.
	l.handle, l.fn, l.present = 0, funcs{}, map[string]bool{}
	return err
}

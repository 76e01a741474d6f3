package daemon

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/packages"
)

// prepareOpts are the options of a preparation this daemon makes.
func (d *Daemon) prepareOpts(frozen bool, targets []string) prepareOptions {
	return prepareOptions{frozen: frozen, targets: targets, lookup: d.lookup, reload: d.reload}
}

// reload reads a compose file the daemon just edited, in its namespace.
func (d *Daemon) reload(path string) (*composefile.File, error) {
	f, err := composefile.Load(path, d.lookup)
	if err != nil {
		return nil, err
	}
	d.applyNamespace(f)
	return f, nil
}

// preparePackages prepares f's packages for p (see packageManager.prepare)
// and records what its package containers run.
func (d *Daemon) preparePackages(ctx context.Context, p *project, f *composefile.File, targets []string, frozen bool) (*prepared, error) {
	prep, err := d.pk.prepare(ctx, f, d.prepareOpts(frozen, targets))
	if err != nil {
		return nil, err
	}
	if prep.adapterAdded != "" {
		_, need, why := adapterNeed(prep.file, prep.lock)
		if need {
			why = ": " + why
		}
		d.log.Info("added the sandbox adapter to the compose file", "file", prep.file.Path, "container", prep.adapterAdded)
		fmt.Fprintf(d.out, "compose: added container %s (package://%s, version '%s') to %s%s\n",
			prep.adapterAdded, prep.adapterAdded, composefile.AdapterSelector, prep.file.Path, why)
	}
	p.setPackages(prep.pkgs, frozen)
	return prep, nil
}

// BuildOptions configure Build (`iii compose build`).
type BuildOptions struct {
	// File is the compose file ("" = ./worker-compose.yaml in Cwd).
	File string
	// Frozen checks the lock instead of writing it and never edits the
	// compose file.
	Frozen bool
	Cwd    string
	// LookupEnv reads the environment (interpolation, the registry and
	// cache locations); nil means the process's.
	LookupEnv func(string) (string, bool)
	// Executable is the iii binary (its registry/ directory is the
	// default registry); "" means this process's.
	Executable string
	Packages   PackageOptions
	// Out receives what Build did, one line per container.
	Out io.Writer
}

// BuildResult is what Build prepared.
type BuildResult struct {
	File        string
	Lock        string // "" when the project has no lock (no package://)
	LockWritten bool
	// AdapterAdded is the container written into the file ("" for none).
	AdapterAdded string
	Containers   []BuiltContainer
}

// BuiltContainer is one container of a build.
type BuiltContainer struct {
	Container string
	// Package is "name version" for a package://, "" for a path://.
	Package string
	Type    string
	Dir     string // the cache entry
	Reused  bool
}

// Build is `iii compose build`: it reads and validates the compose file,
// prepares the lock (checks it with Frozen), and downloads every
// package:// worker into the shared cache. It connects to no engine,
// starts no worker and runs no hook.
func Build(ctx context.Context, o BuildOptions) (*BuildResult, error) {
	if o.LookupEnv == nil {
		o.LookupEnv = os.LookupEnv
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, compose.New(compose.CodeIOError, "cannot read the working directory: "+err.Error())
		}
		o.Cwd = wd
	}
	path := o.File
	if path == "" {
		path = composefile.FileName
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(o.Cwd, path)
	}
	if _, err := os.Stat(path); os.IsNotExist(err) && o.File == "" {
		return nil, compose.New(compose.CodeNoComposeFile, fmt.Sprintf(
			"iii compose build found no %s in %s; run it in the project directory or pass -f <file>", composefile.FileName, o.Cwd))
	}
	f, err := composefile.Load(path, o.LookupEnv)
	if err != nil {
		return nil, err
	}
	if o.Packages.Progress == nil {
		o.Packages.Progress = packages.Printer(o.Out, false)
	}
	m := newPackageManager(o.Packages, o.LookupEnv, o.Executable)
	prep, err := m.prepare(ctx, f, prepareOptions{frozen: o.Frozen, lookup: o.LookupEnv,
		reload: func(p string) (*composefile.File, error) { return composefile.Load(p, o.LookupEnv) }})
	if err != nil {
		return nil, err
	}
	f = prep.file
	res := &BuildResult{File: f.Path, LockWritten: prep.lockWritten, AdapterAdded: prep.adapterAdded}
	if prep.lock != nil {
		res.Lock = prep.lockPath
	}
	for _, key := range f.Order {
		bc := BuiltContainer{Container: key}
		if pi := prep.pkgs[key]; pi != nil {
			bc.Package = pi.entry.Resolved.Name + " " + pi.entry.Resolved.Version
			bc.Type, bc.Dir, bc.Reused = pi.entry.Resolved.Type, pi.inst.Dir, pi.inst.Reused
		}
		res.Containers = append(res.Containers, bc)
	}
	return res, nil
}

// LockPath is the lock of a compose file (worker-compose.lock beside it).
func LockPath(composePath string) string { return lockfile.PathFor(composePath) }

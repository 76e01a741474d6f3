package daemon

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/fileedit"
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/packages"
	"github.com/iii-sandbox/iii/compose/registry"
)

// PackageOptions configure how Compose resolves and installs package://
// workers. Zero values take the environment's: $III_REGISTRY (else the
// registry/ directory beside iii), the package cache of
// $III_COMPOSE_STATE_DIR or ~/.iii/compose, this host's platform.
type PackageOptions struct {
	// Registry is the default registry (package://<name>): an http(s)
	// URL or a directory.
	Registry string
	// Cache is the package cache directory.
	Cache string
	// Platform replaces the host's (tests simulate other hosts).
	Platform *registry.Platform
	// Progress is told about downloads.
	Progress packages.Progress
	// HTTP fetches from registries.
	HTTP *http.Client
}

// packageManager resolves, locks and installs package:// containers.
type packageManager struct {
	client     *registry.Client
	defLoc     registry.Location
	defErr     error
	installer  *packages.Installer
	cacheErr   error
	plat       registry.Platform
	bundlesOff bool
}

func newPackageManager(o PackageOptions, lookup func(string) (string, bool), executable string) *packageManager {
	getenv := func(k string) string {
		v, _ := lookup(k)
		return v
	}
	m := &packageManager{client: &registry.Client{HTTP: o.HTTP}}
	if o.Registry != "" {
		m.defLoc, m.defErr = registry.ParseLocation(o.Registry)
	} else {
		m.defLoc, m.defErr = registry.DefaultLocation(getenv, func() (string, error) {
			if executable != "" {
				return executable, nil
			}
			return os.Executable()
		})
	}
	cache := o.Cache
	if cache == "" {
		cache, m.cacheErr = packages.CacheDir(getenv, func() (string, error) {
			if h := getenv("HOME"); h != "" {
				return h, nil
			}
			return os.UserHomeDir()
		})
	}
	m.installer = &packages.Installer{Dir: cache, HTTP: o.HTTP, Progress: o.Progress}
	if o.Platform != nil {
		m.plat = *o.Platform
	} else {
		m.plat = registry.HostPlatform()
	}
	m.bundlesOff = getenv(registry.EnvBundlesDisabled) == "1"
	return m
}

// location is the registry of a package:// source.
func (m *packageManager) location(src composefile.Source) (registry.Location, error) {
	if src.Registry == "" {
		return m.defLoc, m.defErr
	}
	return registry.HostLocation(src.Registry)
}

// sourceOf reads a locked worker reference (package://[host/]name).
func sourceOf(worker string) composefile.Source {
	ref := strings.TrimPrefix(worker, lockfile.PackageScheme)
	src := composefile.Source{Kind: composefile.SourcePackage, Name: ref}
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		src.Registry, src.Name = ref[:i], ref[i+1:]
	}
	return src
}

// workerRef is the worker: value of a package in a registry.
func workerRef(src composefile.Source, name string) string {
	if src.Registry != "" {
		return "package://" + src.Registry + "/" + name
	}
	return "package://" + name
}

// forContainer prefixes a coded error with the container it is about.
func forContainer(key string, err error) error {
	ce := asComposeError(err)
	return compose.New(ce.Code, fmt.Sprintf("container %q: %s", key, ce.Message))
}

// resolver resolves within one operation: each index is read once, each
// answer of a registry speaking upstream's protocol is reused
// (registry.Resolver).
type resolver struct {
	m  *packageManager
	rr *registry.Resolver
}

func (m *packageManager) newResolver() *resolver {
	return &resolver{m: m, rr: m.client.NewResolver(m.plat.Target())}
}

// latest is the exact version compose::add writes for an unpinned
// package.
func (r *resolver) latest(ctx context.Context, src composefile.Source) (string, error) {
	loc, err := r.m.location(src)
	if err != nil {
		return "", err
	}
	return r.rr.Latest(ctx, loc, src.Name)
}

// entry resolves a selector of a source into a lock entry. Packages that
// are built into the engine, or images, cannot be locked.
func (r *resolver) entry(ctx context.Context, src composefile.Source, worker, sel string) (*lockfile.Entry, *registry.Version, error) {
	loc, err := r.m.location(src)
	if err != nil {
		return nil, nil, err
	}
	v, ver, err := r.rr.Resolve(ctx, loc, src.Name, sel)
	if err != nil {
		return nil, nil, err
	}
	e, err := lockEntry(src, worker, sel, v, ver, loc)
	return e, ver, err
}

func lockEntry(src composefile.Source, worker, sel, v string, ver *registry.Version, loc registry.Location) (*lockfile.Entry, error) {
	switch ver.Kind {
	case registry.KindEngine, registry.KindImage:
		_, err := registry.Installable(src.Name, v, ver.Kind, nil, registry.Platform{}, false)
		return nil, err
	}
	if len(ver.Artifacts) == 0 {
		return nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf("%s %s in %s lists no artefact at all", src.Name, v, loc.Describe()))
	}
	cfg, err := lockfile.ConfigFromJSON(ver.DefaultConfig)
	if err != nil {
		return nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf("%s %s in %s: default_config: %v", src.Name, v, loc.Describe(), err))
	}
	e := &lockfile.Entry{Worker: worker, Requested: lockfile.RequestedOf(sel), Resolved: lockfile.Resolved{
		Name: src.Name, Version: v, Type: ver.Kind, Artifacts: map[string]lockfile.Artifact{}, DefaultConfig: cfg}}
	for t, a := range ver.Artifacts {
		e.Resolved.Artifacts[t] = lockfile.Artifact{URL: a.URL, SHA256: a.SHA256}
	}
	return e, nil
}

// plan is the lock f needs: the entry of every package:// container whose
// declaration (worker and selector) is what base locked is kept as it is
// (not resolved again); the others, and the keys in force, are resolved.
// Graphs keep their roots and nodes that are still locked.
func (r *resolver) plan(ctx context.Context, f *composefile.File, base *lockfile.Lock, force map[string]bool) (*lockfile.Lock, error) {
	out := lockfile.New()
	for _, key := range lockfile.PackageKeys(f) {
		c := f.Containers[key]
		if e := base.EntryOf(key); !force[key] && e.SameDeclaration(c.Worker, c.Version) {
			out.Containers[key] = e
			continue
		}
		e, _, err := r.entry(ctx, c.Source, c.Worker, c.Version)
		if err != nil {
			return nil, forContainer(key, err)
		}
		out.Containers[key] = e
	}
	if base != nil {
		for root, nodes := range base.Graphs {
			if out.Containers[root] == nil {
				continue
			}
			var kept []string
			for _, n := range nodes {
				if out.Containers[n] != nil {
					kept = append(kept, n)
				}
			}
			if out.Graphs == nil {
				out.Graphs = map[string][]string{}
			}
			out.Graphs[root] = kept
		}
	}
	return out, nil
}

// pkgInfo is what a package container runs: its lock entry and its
// verified cache entry.
type pkgInfo struct {
	entry  *lockfile.Entry
	inst   *packages.Installed
	target string
}

// defaults is the package's default configuration, the lowest layer.
func (pi *pkgInfo) defaults() (any, bool) {
	if pi == nil || pi.entry.Resolved.DefaultConfig == nil {
		return nil, false
	}
	v, err := normalize(pi.entry.Resolved.DefaultConfig)
	if err != nil {
		return nil, false
	}
	return v, true
}

// install checks every key's locked package can be installed here (before
// anything is downloaded), then downloads and verifies each into the
// cache, from the locked URL against the locked digest.
func (m *packageManager) install(ctx context.Context, f *composefile.File, l *lockfile.Lock, keys []string) (map[string]*pkgInfo, error) {
	out := map[string]*pkgInfo{}
	type job struct {
		key    string
		e      *lockfile.Entry
		req    packages.Request
		target string
	}
	var jobs []job
	for _, key := range keys {
		e := l.EntryOf(key)
		if e == nil {
			return nil, compose.New(compose.CodeComposeLockOutOfDate, fmt.Sprintf("container %q is not in the lock", key))
		}
		target, err := registry.Installable(e.Resolved.Name, e.Resolved.Version, e.Resolved.Type, sortedTargets(e), m.plat, m.bundlesOff)
		if err != nil {
			return nil, forContainer(key, err)
		}
		if c := f.Containers[key]; c != nil && c.Runtime != "" && e.Resolved.Type != registry.KindBundle {
			return nil, compose.New(compose.CodeRuntimeRequiresBundle, fmt.Sprintf(
				"container %q: runtime: %s applies only to bundle packages, and %s %s is a %s; remove runtime:", key, c.Runtime, e.Resolved.Name, e.Resolved.Version, e.Resolved.Type))
		}
		loc, err := m.location(sourceOf(e.Worker))
		if err != nil {
			return nil, forContainer(key, err)
		}
		art := e.Resolved.Artifacts[target]
		u, err := loc.ArtifactURL(e.Resolved.Name, art.URL)
		if err != nil {
			return nil, forContainer(key, err)
		}
		jobs = append(jobs, job{key, e, packages.Request{Name: e.Resolved.Name, Version: e.Resolved.Version, Kind: e.Resolved.Type, Target: target, URL: u, SHA256: art.SHA256}, target})
	}
	if len(jobs) > 0 && m.cacheErr != nil {
		return nil, m.cacheErr
	}
	for _, j := range jobs {
		inst, err := m.installer.Install(ctx, j.req)
		if err != nil {
			return nil, forContainer(j.key, err)
		}
		out[j.key] = &pkgInfo{entry: j.e, inst: inst, target: j.target}
	}
	return out, nil
}

func sortedTargets(e *lockfile.Entry) []string {
	out := make([]string, 0, len(e.Resolved.Artifacts))
	for t := range e.Resolved.Artifacts {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// prepared is the outcome of preparing a file's packages.
type prepared struct {
	file     *composefile.File // the file, edited when the adapter was added
	lock     *lockfile.Lock    // nil: the project has no lock (and needs none)
	lockPath string
	pkgs     map[string]*pkgInfo
	// adapterAdded is the container Compose wrote into the file.
	adapterAdded string
	lockWritten  bool
}

// prepareOptions tune prepare.
type prepareOptions struct {
	frozen bool
	// targets limit the installs to these containers and what they start
	// after (all when empty).
	targets []string
	// lookup interpolates the file when it is edited; reload reads it
	// back (with the daemon's namespace applied).
	lookup func(string) (string, bool)
	reload func(path string) (*composefile.File, error)
}

// prepare makes a file's packages ready to run: frozen, it checks the
// lock (never resolving, never writing); otherwise it resolves what the
// lock does not cover, adds the sandbox adapter to the file when the
// project needs it and does not declare it, downloads and verifies every
// package to install, and only then writes the lock (when it changed).
func (m *packageManager) prepare(ctx context.Context, f *composefile.File, o prepareOptions) (*prepared, error) {
	lockPath := lockfile.PathFor(f.Path)
	old, err := lockfile.Read(lockPath)
	if err != nil {
		return nil, err
	}
	out := &prepared{file: f, lockPath: lockPath}
	var lock *lockfile.Lock
	if o.frozen {
		if err := adapterNotDeclared(f, old, true); err != nil {
			return nil, err
		}
		if err := lockfile.CheckFrozen(f, old, lockPath); err != nil {
			return nil, err
		}
		lock = old
	} else {
		r := m.newResolver()
		if lock, err = r.plan(ctx, f, old, nil); err != nil {
			return nil, err
		}
		if adapter, need, _ := adapterNeed(f, lock); need && !declaresAdapter(f, adapter) {
			if adapter != composefile.AdapterPackage {
				return nil, adapterNotDeclared(f, lock, false)
			}
			if f, err = addAdapter(f, o); err != nil {
				return nil, err
			}
			out.file, out.adapterAdded = f, adapter
			if lock, err = r.plan(ctx, f, lock, nil); err != nil {
				return nil, err
			}
		}
	}
	keys := lockfile.PackageKeys(f)
	if len(o.targets) > 0 {
		order, err := f.StartOrder(o.targets...)
		if err != nil {
			return nil, err
		}
		keys = slices.DeleteFunc(order, func(k string) bool { return f.Containers[k].Source.Kind != composefile.SourcePackage })
	}
	if len(keys) > 0 {
		if out.pkgs, err = m.install(ctx, f, lock, keys); err != nil {
			return nil, err
		}
	}
	out.lock = lock
	if !o.frozen && lock != nil && (len(lock.Containers) > 0 || old != nil) {
		if out.lockWritten, err = lockfile.Write(lockPath, lock); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// adapterNeed says whether a project needs a sandbox adapter, which one,
// and why: it sets engine.sandbox for its own namespace, or it has a VM
// worker (a bundle package without runtime: host, or a path:// worker
// whose iii.worker.yaml sets runtime.base_image).
func adapterNeed(f *composefile.File, l *lockfile.Lock) (adapter string, need bool, why string) {
	adapter = composefile.AdapterPackage
	if e := f.Engine; e != nil && !e.Empty && e.Sandbox != nil {
		ns := e.Sandbox.Namespace
		if ns == "" {
			ns = f.Namespace
		}
		if ns == f.Namespace {
			return e.Sandbox.Adapter, true, fmt.Sprintf("it sets engine.sandbox for its own namespace %q", f.Namespace)
		}
	}
	for _, key := range f.Order {
		c := f.Containers[key]
		switch c.Source.Kind {
		case composefile.SourcePackage:
			if e := l.EntryOf(key); e != nil && e.Resolved.Type == registry.KindBundle && c.Runtime != "host" {
				return adapter, true, fmt.Sprintf("container %q is a bundle, which runs in a VM", key)
			}
		case composefile.SourcePath:
			if baseImage(c.Source.Path) != "" {
				return adapter, true, fmt.Sprintf("container %q sets runtime.base_image in its %s, so it runs in a VM", key, ManifestFile)
			}
		}
	}
	return adapter, false, ""
}

// baseImage is runtime.base_image of a worker directory's manifest ("" when
// there is none or it cannot be read; the start reports a bad manifest).
func baseImage(dir string) string {
	data, err := os.ReadFile(dir + string(os.PathSeparator) + ManifestFile)
	if err != nil || len(data) > maxManifestSize {
		return ""
	}
	m, err := parseManifest(data, ManifestFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(m.Runtime.BaseImage)
}

func declaresAdapter(f *composefile.File, adapter string) bool {
	for _, c := range f.Containers {
		if c.Source.Kind == composefile.SourcePackage && c.Source.Name == adapter {
			return true
		}
	}
	return false
}

// adapterNotDeclared is SANDBOX_ADAPTER_NOT_DECLARED for a project that
// needs an adapter it does not declare, when Compose may not (frozen) or
// cannot (another adapter than sandbox-libkrun) add it; nil otherwise.
func adapterNotDeclared(f *composefile.File, l *lockfile.Lock, frozen bool) error {
	adapter, need, why := adapterNeed(f, l)
	if !need || declaresAdapter(f, adapter) {
		return nil
	}
	sel := composefile.AdapterSelector
	if frozen {
		return compose.New(compose.CodeSandboxAdapterNotDeclared, fmt.Sprintf(
			"%s needs the sandbox adapter %s (%s) but does not declare it, and --frozen never edits the compose file; "+
				"run `iii compose --up` once without --frozen so Compose writes the container and the lock, then commit both files. The container it writes:\n\n"+
				"containers:\n  %s:\n    worker: package://%s\n    version: '%s'",
			f.Path, adapter, why, adapter, adapter, sel))
	}
	return compose.New(compose.CodeSandboxAdapterNotDeclared, fmt.Sprintf(
		"%s needs the sandbox adapter %s (%s) but does not declare it, and Compose installs only %s by itself; declare it:\n\n"+
			"containers:\n  %s:\n    worker: package://%s\n    version: '<version>'",
		f.Path, adapter, why, composefile.AdapterPackage, adapter, adapter))
}

// addAdapter writes the sandbox-libkrun container (pinned to the contract
// range) into the compose file, keeping everything else as written, and
// reads the file back.
func addAdapter(f *composefile.File, o prepareOptions) (*composefile.File, error) {
	doc, err := fileedit.Read(f.Path)
	if err != nil {
		return nil, err
	}
	a := fileedit.AdapterAddition(composefile.AdapterPackage, composefile.AdapterSelector)
	if err := doc.Upsert(a.Key, a.Merged(nil)); err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("edit %s: %v", f.Path, err))
	}
	if _, err := doc.Commit(o.lookup); err != nil {
		return nil, err
	}
	return o.reload(f.Path)
}

package daemon

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/fileedit"
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/vmworkers"
	"github.com/iii-sandbox/iii/compose/yamlbuild"
)

type addResult struct {
	File      string    `json:"file"`
	Added     []string  `json:"added"`
	Changed   []string  `json:"changed"`
	Unchanged []string  `json:"unchanged"`
	Edited    bool      `json:"edited"`
	Up        *opResult `json:"up,omitempty"`
}

// fnAdd edits the compose file (comments, blank lines and quoting kept;
// the result fully validated before an atomic write), then restarts the
// changed containers in place and starts the new ones in dependency
// order. A no-op edits nothing and restarts nothing.
func (d *Daemon) fnAdd(ctx context.Context, r *request) (any, error) {
	adds, err := fileedit.ParseAdditions(r.Worker, r.Workers)
	if err != nil {
		return nil, err
	}
	path, err := d.filePath(r)
	if err != nil {
		var ce *compose.Error
		if errors.As(err, &ce) && ce.Code == compose.CodeNoComposeFile {
			return nil, noFileForAdd(d.cwd, adds)
		}
		return nil, err
	}
	doc, err := fileedit.Read(path)
	if err != nil {
		return nil, err
	}
	lockPath := lockfile.PathFor(canonicalOr(path))
	old, err := lockfile.Read(lockPath)
	if err != nil {
		return nil, err
	}
	seed := old.Clone()
	if seed == nil {
		seed = lockfile.New()
	}
	for _, a := range adds {
		if old := doc.Node(a.Key); old != nil {
			if oldKind := fileedit.KindOf(old); oldKind != "" && oldKind != a.Kind {
				return nil, compose.New(compose.CodeWorkerSourceChanged, fmt.Sprintf(
					"container %q is a %s:// worker in %s; compose::add cannot make it a %s:// one. Remove it first (compose::remove worker=%s), then add it again",
					a.Key, oldKind, path, a.Kind, a.Key))
			}
		}
	}
	rs := d.pk.newResolver()
	if adds, err = d.resolveAdditions(ctx, rs, doc, adds, seed); err != nil {
		return nil, err
	}
	res := &addResult{File: path, Added: []string{}, Changed: []string{}, Unchanged: []string{}}
	for _, a := range adds {
		old := doc.Node(a.Key)
		if old != nil {
			if oldKind := fileedit.KindOf(old); oldKind != "" && oldKind != a.Kind {
				return nil, compose.New(compose.CodeWorkerSourceChanged, fmt.Sprintf(
					"container %q (a dependency) is a %s:// worker in %s, not a %s:// one; rename it", a.Key, oldKind, path, a.Kind))
			}
		}
		next := a.Merged(old)
		if old != nil && fileedit.NodeText(old) == fileedit.NodeText(next) {
			res.Unchanged = append(res.Unchanged, a.Key)
			continue
		}
		if err := doc.Upsert(a.Key, next); err != nil {
			return nil, compose.New(compose.CodeIOError, fmt.Sprintf("edit %s: %v", path, err))
		}
		// Positions moved: read the tree again for the next edit.
		if err = doc.Reparse(); err != nil {
			return nil, err
		}
		if old == nil {
			res.Added = append(res.Added, a.Key)
		} else {
			res.Changed = append(res.Changed, a.Key)
		}
	}
	if len(res.Added)+len(res.Changed) == 0 {
		return res, nil
	}
	// The edited file loads, its packages resolve and are downloaded and
	// verified before the file or the lock is written.
	f, err := doc.Parse(d.lookup)
	if err != nil {
		return nil, err
	}
	d.applyNamespace(f)
	lock, err := rs.plan(ctx, f, seed, nil)
	if err != nil {
		return nil, err
	}
	var install []string
	for _, key := range append(append([]string{}, res.Added...), res.Changed...) {
		if f.Containers[key].Source.Kind == composefile.SourcePackage {
			install = append(install, key)
		}
	}
	pkgs, err := d.pk.install(ctx, f, lock, install)
	if err != nil {
		return nil, err
	}
	if f, err = doc.Commit(d.lookup); err != nil {
		return nil, err
	}
	res.File, res.Edited = f.Path, true
	d.applyNamespace(f)
	if len(lock.Containers) > 0 || old != nil {
		if _, err := lockfile.Write(lockfile.PathFor(f.Path), lock); err != nil {
			return nil, err
		}
	}
	if err := d.checkEngineSection(f); err != nil {
		return res, nil
	}
	p, err := d.projectFor(f)
	if err != nil {
		return nil, err
	}
	if err := p.acquire(ctx); err != nil {
		return nil, err
	}
	defer p.release()
	p.mu.Lock()
	frozen := p.frozen
	p.mu.Unlock()
	p.setPackages(pkgs, frozen)
	for _, key := range res.Changed {
		p.mu.Lock()
		c := p.cs[key]
		running := c != nil && c.running()
		p.mu.Unlock()
		if running {
			p.stopOne(ctx, c, nil)
		}
	}
	up, err := p.up(ctx, f, append(append([]string{}, res.Changed...), res.Added...))
	if err != nil {
		return nil, err
	}
	res.Up = up
	return res, nil
}

// resolveAdditions resolves the registry packages compose::add adds: an
// unpinned one is written as its exact latest version (a tag or range
// stays as given), a root of kind engine or image is refused, and each
// root's registry dependencies are added as generated containers (shared
// ones once, engine-kind ones skipped) with start_after edges, recorded
// in the lock's graphs.
func (d *Daemon) resolveAdditions(ctx context.Context, rs *resolver, doc *fileedit.Doc, adds []*fileedit.Addition, seed *lockfile.Lock) ([]*fileedit.Addition, error) {
	var cur *composefile.File
	adding := map[string]bool{}
	for _, a := range adds {
		adding[a.Key] = true
	}
	out := adds
	gen := generatedKeys(seed.Graphs)
	for _, a := range adds {
		if a.Kind != composefile.SourcePackage {
			continue
		}
		if cur == nil {
			var err error
			if cur, err = composefile.Parse(doc.Bytes(), doc.Path, d.lookup); err != nil {
				return nil, err
			}
		}
		if a.Latest {
			v, err := rs.latest(ctx, a.Src)
			if err != nil {
				return nil, forContainer(a.Key, err)
			}
			a.Fields["version"] = fileedit.VersionNode(v)
			a.Latest = false
		}
		worker := a.Fields["worker"].Value
		e, ver, err := rs.entry(ctx, a.Src, worker, a.Fields["version"].Value)
		if err != nil {
			return nil, forContainer(a.Key, err)
		}
		seed.Containers[a.Key] = e
		nodes, edges, err := rs.expand(ctx, a.Key, a.Src, ver, cur, nil)
		if err != nil {
			return nil, forContainer(a.Key, err)
		}
		for _, k := range sortedMapKeys(nodes) {
			n := nodes[k]
			if n.declared || adding[k] {
				continue
			}
			adding[k] = true
			out = append(out, generatedAddition(n))
			seed.Containers[k] = n.entry
		}
		if len(edges) > 0 {
			var after []string
			if n := a.Fields["start_after"]; n != nil {
				for _, it := range n.Content {
					after = append(after, it.Value)
				}
			} else if old := yamlbuild.Child(doc.Node(a.Key), "start_after"); old != nil {
				for _, it := range old.Content {
					after = append(after, it.Value)
				}
			}
			for _, e := range edges {
				if !slices.Contains(after, e) {
					after = append(after, e)
				}
			}
			a.Fields["start_after"] = fileedit.FlowList(after)
		}
		// An added package is an explicit registry root: its graph
		// records what it pulled in (itself at least).
		if seed.Graphs == nil {
			seed.Graphs = map[string][]string{}
		}
		seed.Graphs[a.Key] = graphOf(a.Key, nodes, gen)
	}
	return out, nil
}

// canonicalOr resolves symlinks in p, or returns it as it is.
func canonicalOr(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		return real
	}
	return p
}

// noFileForAdd explains what to write when compose::add has no file to
// edit: it only edits a compose file that exists.
func noFileForAdd(cwd string, adds []*fileedit.Addition) error {
	var b strings.Builder
	b.WriteString("containers:\n")
	for _, a := range adds {
		lines, err := fileedit.Render(a.Key, a.Merged(nil), 2, 2)
		if err == nil {
			b.WriteString(strings.Join(lines, "\n") + "\n")
		}
	}
	return compose.New(compose.CodeNoComposeFile, fmt.Sprintf(
		"compose::add only edits a compose file that exists, and the daemon's working directory %s has no %s (pass file=<path> for another). "+
			"Write one that declares what you want to add; a file without an engine: section must declare at least one container, and Compose then attaches to your engine:\n\n%s\n"+
			"then start it with `iii compose --up` (add --engine ws://<host>:<port> and --namespace <ns> to attach to an engine you run yourself)",
		cwd, composefile.FileName, b.String()))
}

type removeResult struct {
	File    string    `json:"file"`
	Removed string    `json:"removed"`
	Down    *opResult `json:"down,omitempty"`
	Up      *opResult `json:"up,omitempty"`
	// VMState is what became of a removed VM container's state
	// directory (worker::remove).
	VMState  *vmStateJSON  `json:"vm_state,omitempty"`
	Warnings []warningJSON `json:"warnings,omitempty"`
}

// fnRemove takes a container out of the file, stops it, deletes the state
// of its VM when it ran in one, and runs the idempotent up of the project
// that follows (when the project runs).
func (d *Daemon) fnRemove(ctx context.Context, r *request) (any, error) {
	key, ok, err := stringArg(fnRemove, "worker", r.Worker)
	if err != nil {
		return nil, err
	}
	if !ok || key == "" {
		return nil, compose.New(compose.CodeInvalidWorkerSpec, "compose::remove needs worker=<container key>")
	}
	path, err := d.filePath(r)
	if err != nil {
		return nil, err
	}
	doc, err := fileedit.Read(path)
	if err != nil {
		return nil, err
	}
	before, berr := composefile.Load(path, d.lookup)
	if doc.Node(key) == nil {
		if berr != nil {
			return nil, berr
		}
		return nil, unknownContainer(before, key)
	}
	// What the container is, by the file as it was: whether it runs in a
	// VM (and which) is needed after it has left the file.
	var ref *vmworkers.Ref
	var p *project
	if berr == nil {
		d.applyNamespace(before)
		p = d.loadedProject(before.Path)
		var l *lockfile.Lock
		if p != nil {
			l = p.lockOf(before)
		} else {
			l, _ = lockfile.Read(lockfile.PathFor(before.Path))
		}
		vms := vmContainers(before, l)
		if err := adapterInUse(before, key, vms); err != nil {
			return nil, err
		}
		if slices.Contains(vms, key) {
			ref = d.vmRefFor(before, key)
		}
	}
	if p != nil {
		p.mu.Lock()
		if c := p.cs[key]; c != nil && c.vm != nil {
			ref = c.vm
		}
		p.mu.Unlock()
	}
	if err := doc.Delete(key); err != nil {
		return nil, err
	}
	f, err := doc.Commit(d.lookup)
	if err != nil {
		return nil, err
	}
	d.applyNamespace(f)
	res := &removeResult{File: f.Path, Removed: key}
	if p = d.loadedProject(f.Path); p != nil {
		if err := p.acquire(ctx); err != nil {
			return nil, err
		}
		defer p.release()
		res.Down = newOp()
		c := p.get(key)
		res.Down.add(containerResult{Container: key, State: "stopped", Changed: p.stopOne(ctx, c, nil)})
		p.mu.Lock()
		delete(p.cs, key)
		if c.log != nil {
			_ = c.log.Close()
		}
		p.saveLocked()
		p.mu.Unlock()
	}
	if ref != nil {
		vs, w := d.removeVMState(ctx, p, before, f, key, ref)
		res.VMState = vs
		if w != nil {
			res.Warnings = append(res.Warnings, *w)
		}
	}
	if p == nil || !p.anyRunning() {
		return res, nil
	}
	if err := d.checkEngineSection(f); err != nil {
		return res, nil
	}
	up, err := p.up(ctx, f, nil)
	if err != nil {
		return nil, err
	}
	res.Up = up
	return res, nil
}

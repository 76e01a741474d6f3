package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/fileedit"
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/registry"
)

// updateEntry is one container in compose::update's result.
type updateEntry struct {
	Container string `json:"container"`
	From      string `json:"from"`
	To        string `json:"to"`
	Detail    string `json:"detail"`
	// Changed: the container runs different content now (type, default
	// configuration or the host's artefact digest).
	Changed bool `json:"changed"`
}

type updateResult struct {
	File    string        `json:"file"`
	Updated []updateEntry `json:"updated"`
	// Added and Removed are generated dependencies the new graphs brought
	// in or no longer need.
	Added   []string `json:"added"`
	Removed []string `json:"removed"`
	// Restarted: the whole project restarted once, because content
	// changed while it ran; or, when only running sandbox adapters
	// changed, just those (Up lists them and their VM workers).
	Restarted bool      `json:"restarted"`
	Down      *opResult `json:"down,omitempty"`
	Up        *opResult `json:"up,omitempty"`
}

// updateTarget is a container compose::update resolves again, with the
// selector it resolves ("" = decide: the bare update's policy).
type updateTarget struct {
	key string
	sel string
}

// fnUpdate re-resolves package:// workers (spec §5.9). No worker: every
// package root moves to its registry's latest (the sandbox adapter to the
// contract range); worker=name resolves the selector in the file again;
// worker=name@sel changes it. The new artefacts are downloaded and
// verified before the file, the lock or any worker changes; when content
// changed the whole project restarts once.
func (d *Daemon) fnUpdate(ctx context.Context, r *request) (any, error) {
	f, err := d.loadFile(r)
	if err != nil {
		return nil, err
	}
	var names []string
	if t := strings.TrimSpace(string(r.Workers)); t != "" && t != "null" {
		var list []string
		if err := json.Unmarshal(r.Workers, &list); err != nil || len(list) == 0 {
			return nil, compose.New(CodeInvalidArgument, "compose::update: workers must be a non-empty list of names (name or name@selector)")
		}
		names = list
	} else if s, ok, err := stringArg(fnUpdate, "worker", r.Worker); err != nil {
		return nil, err
	} else if ok {
		names = []string{s}
	}
	old, err := lockfile.Read(lockfile.PathFor(f.Path))
	if err != nil {
		return nil, err
	}
	var targets []updateTarget
	if len(names) == 0 {
		gen := map[string]bool{}
		if old != nil {
			gen = generatedKeys(old.Graphs)
		}
		for _, key := range lockfile.PackageKeys(f) {
			if !gen[key] {
				targets = append(targets, updateTarget{key: key})
			}
		}
		if len(targets) == 0 {
			return &updateResult{File: f.Path, Updated: []updateEntry{}, Added: []string{}, Removed: []string{}}, nil
		}
	}
	for _, n := range names {
		key, sel, hasSel := strings.Cut(n, "@")
		c, ok := f.Containers[key]
		if !ok {
			return nil, unknownContainer(f, key)
		}
		if c.Source.Kind != composefile.SourcePackage {
			return nil, compose.New(compose.CodeNotAPackageContainer, fmt.Sprintf(
				"container %q is a path:// worker; compose::update updates package:// workers only (a path:// worker runs what its directory holds)", key))
		}
		if hasSel {
			if err := registry.CheckSelector(sel); err != nil {
				return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("compose::update worker=%s: %v", clip(n, 120), err))
			}
		} else {
			sel = c.Version
		}
		targets = append(targets, updateTarget{key: key, sel: sel})
	}
	// A project this daemon runs is held for the whole update: nothing
	// starts or stops meanwhile.
	p := d.loadedProject(f.Path)
	if p != nil {
		if err := p.acquire(ctx); err != nil {
			return nil, err
		}
		defer p.release()
	}
	return d.update(ctx, p, f, old, targets)
}

func (d *Daemon) update(ctx context.Context, p *project, f *composefile.File, old *lockfile.Lock, targets []updateTarget) (*updateResult, error) {
	rs := d.pk.newResolver()
	base := old.Clone()
	if base == nil {
		base = lockfile.New()
	}
	var oldGraphs map[string][]string
	if old != nil {
		oldGraphs = old.Graphs
	}
	gen := generatedKeys(oldGraphs)
	graphs := map[string][]string{}
	for k, v := range oldGraphs {
		graphs[k] = v
	}
	res := &updateResult{File: f.Path, Updated: []updateEntry{}, Added: []string{}, Removed: []string{}}
	newSel := map[string]string{}
	detail := map[string][]string{}
	var order []string
	nodes := map[string]*graphNode{}
	edges := map[string][]string{}
	for _, t := range targets {
		c := f.Containers[t.key]
		sel := t.sel
		if sel == "" {
			switch {
			case c.Source.Name == composefile.AdapterPackage:
				// The adapter follows the sandbox contract this engine
				// serves, not the newest release.
				sel = composefile.AdapterSelector
			case registry.IsTag(c.Version):
				sel = c.Version
			default:
				var err error
				if sel, err = rs.latest(ctx, c.Source); err != nil {
					return nil, forContainer(t.key, err)
				}
			}
		}
		e, ver, err := rs.entry(ctx, c.Source, c.Worker, sel)
		if err != nil {
			return nil, forContainer(t.key, err)
		}
		base.Containers[t.key] = e
		newSel[t.key] = sel
		order = append(order, t.key)
		if sel != c.Version {
			detail[t.key] = append(detail[t.key], fmt.Sprintf("version '%s' → '%s' in the file", c.Version, sel))
		}
		ns, es, err := rs.expand(ctx, t.key, c.Source, ver, f, gen)
		if err != nil {
			return nil, forContainer(t.key, err)
		}
		edges[t.key] = es
		// An updated container is an explicit registry root: its graph
		// records what it pulled in (itself at least).
		graphs[t.key] = graphOf(t.key, ns, gen)
		for k, n := range ns {
			if prev := nodes[k]; prev != nil && prev.entry != nil && n.entry != nil && prev.entry.Resolved.Version != n.entry.Resolved.Version {
				return nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
					"the dependency %s is needed at %s and at %s by the workers being updated; update them one at a time", k, prev.entry.Resolved.Version, n.entry.Resolved.Version))
			}
			nodes[k] = n
		}
	}
	// Generated containers no root uses any more go; hand-declared ones
	// never do.
	stillUsed := generatedKeys(graphs)
	for k := range gen {
		if !stillUsed[k] && graphs[k] == nil {
			res.Removed = append(res.Removed, k)
		}
	}
	slices.Sort(res.Removed)

	doc, err := fileedit.Read(f.Path)
	if err != nil {
		return nil, err
	}
	edited := false
	for _, key := range order {
		if newSel[key] != f.Containers[key].Version {
			if err := doc.SetVersion(key, newSel[key]); err != nil {
				return nil, compose.New(compose.CodeIOError, fmt.Sprintf("edit %s: %v", f.Path, err))
			}
			edited = true
		}
	}
	for _, k := range sortedMapKeys(nodes) {
		n := nodes[k]
		if n.declared {
			continue
		}
		base.Containers[k] = n.entry
		c := f.Containers[k]
		before := doc.Text()
		switch {
		case c == nil:
			a := generatedAddition(n)
			if err := doc.Upsert(k, a.Merged(nil)); err != nil {
				return nil, compose.New(compose.CodeIOError, fmt.Sprintf("edit %s: %v", f.Path, err))
			}
			res.Added = append(res.Added, k)
			detail[k] = append(detail[k], "new dependency")
			order = append(order, k)
		case c.Version != n.entry.Resolved.Version:
			if err := doc.SetVersion(k, n.entry.Resolved.Version); err != nil {
				return nil, compose.New(compose.CodeIOError, fmt.Sprintf("edit %s: %v", f.Path, err))
			}
			detail[k] = append(detail[k], fmt.Sprintf("dependency pinned to '%s'", n.entry.Resolved.Version))
			order = append(order, k)
		default:
			order = append(order, k)
		}
		if len(n.deps) > 0 && c != nil {
			if err := doc.AddStartAfter(k, n.deps); err != nil {
				return nil, compose.New(compose.CodeIOError, fmt.Sprintf("edit %s: %v", f.Path, err))
			}
		}
		if doc.Text() != before {
			edited = true
			if err = doc.Reparse(); err != nil {
				return nil, err
			}
		}
	}
	for _, key := range sortedMapKeys(edges) {
		if len(edges[key]) == 0 {
			continue
		}
		before := doc.Text()
		if err := doc.AddStartAfter(key, edges[key]); err != nil {
			return nil, compose.New(compose.CodeIOError, fmt.Sprintf("edit %s: %v", f.Path, err))
		}
		if doc.Text() != before {
			edited = true
			if err = doc.Reparse(); err != nil {
				return nil, err
			}
		}
	}
	if err := doc.DropStartAfter(res.Removed); err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("edit %s: %v", f.Path, err))
	}
	for _, k := range res.Removed {
		if doc.Node(k) != nil {
			if err := doc.Delete(k); err != nil {
				return nil, err
			}
			if err = doc.Reparse(); err != nil {
				return nil, err
			}
			edited = true
		}
		delete(base.Containers, k)
		delete(graphs, k)
	}
	// The edited file must load before anything is downloaded or written.
	nf := f
	if edited {
		if nf, err = doc.Parse(d.lookup); err != nil {
			return nil, err
		}
		d.applyNamespace(nf)
	}
	base.Graphs = graphs
	lock, err := rs.plan(ctx, nf, base, nil)
	if err != nil {
		return nil, err
	}
	pkgs, err := d.pk.install(ctx, nf, lock, lockfile.PackageKeys(nf))
	if err != nil {
		return nil, err
	}
	if edited {
		if nf, err = doc.Commit(d.lookup); err != nil {
			return nil, err
		}
		d.applyNamespace(nf)
	}
	if _, err := lockfile.Write(lockfile.PathFor(nf.Path), lock); err != nil {
		return nil, err
	}

	changed := len(res.Added)+len(res.Removed) > 0
	seen := map[string]bool{}
	for _, key := range order {
		if seen[key] {
			continue
		}
		seen[key] = true
		oe, ne := old.EntryOf(key), lock.EntryOf(key)
		if ne == nil {
			continue
		}
		ue := updateEntry{Container: key, To: ne.Resolved.Version}
		if oe != nil {
			ue.From = oe.Resolved.Version
		}
		target := ""
		if pi := pkgs[key]; pi != nil {
			target = pi.target
		}
		ue.Changed = oe == nil || lockfile.RuntimeChanged(oe, ne, target)
		changed = changed || ue.Changed
		parts := detail[key]
		switch {
		case oe == nil:
			parts = append(parts, "resolved to "+ne.Resolved.Version)
		case ue.From != ue.To:
			parts = append(parts, ue.From+" → "+ue.To)
		case ue.Changed:
			parts = append(parts, ue.To+" again, with new content")
		default:
			parts = append(parts, ue.To+" is current")
		}
		if !ue.Changed && oe != nil {
			parts = append(parts, "the content did not change, nothing restarts")
		}
		ue.Detail = strings.Join(parts, "; ")
		res.Updated = append(res.Updated, ue)
	}
	if p == nil {
		return res, nil
	}
	p.setPackages(pkgs, false)
	if !changed || !p.anyRunning() {
		p.setFile(nf)
		return res, nil
	}
	if err := d.checkEngineSection(nf); err != nil {
		return nil, err
	}
	if keys := p.onlyAdaptersChanged(nf, res); keys != nil {
		// Only running sandbox adapters changed (compose::update
		// worker=sandbox-libkrun): each restarts from its new binary in
		// place, and its sandboxes and worker VMs are adopted by the new
		// process; the rest of the project keeps running.
		p.setFile(nf)
		res.Restarted = true
		res.Up = newOp()
		for _, key := range keys {
			for _, cr := range p.restartAdapterWithVMs(ctx, nf, p.get(key), nf.Containers[key]).Containers {
				res.Up.add(cr)
			}
		}
		return res, nil
	}
	// The whole project restarts once, on the new lock.
	res.Restarted = true
	res.Down = p.down(ctx, p.currentFile(), nil)
	p.mu.Lock()
	for _, k := range res.Removed {
		if c := p.cs[k]; c != nil && c.log != nil {
			_ = c.log.Close()
		}
		delete(p.cs, k)
	}
	p.saveLocked()
	p.mu.Unlock()
	if res.Up, err = p.up(ctx, nf, nil); err != nil {
		return nil, err
	}
	return res, nil
}

// onlyAdaptersChanged returns the containers an update changed when they
// are all running sandbox adapter containers and nothing was added or
// removed, else nil: then the project restarts as a whole.
func (p *project) onlyAdaptersChanged(nf *composefile.File, res *updateResult) []string {
	if len(res.Added)+len(res.Removed) > 0 {
		return nil
	}
	var keys []string
	for _, u := range res.Updated {
		if !u.Changed {
			continue
		}
		decl := nf.Containers[u.Container]
		if decl == nil || !p.isAdapter(nf, decl) {
			return nil
		}
		p.mu.Lock()
		c := p.cs[u.Container]
		running := c != nil && c.adapter != nil && c.running()
		p.mu.Unlock()
		if !running {
			return nil
		}
		keys = append(keys, u.Container)
	}
	return keys
}

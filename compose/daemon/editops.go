package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
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
	adds, err := parseAdditions(r)
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
	doc, err := readDoc(path)
	if err != nil {
		return nil, err
	}
	res := &addResult{File: path, Added: []string{}, Changed: []string{}, Unchanged: []string{}}
	for _, a := range adds {
		old := doc.existingNode(a.key)
		if old != nil {
			if oldKind := kindOf(old); oldKind != "" && oldKind != a.kind {
				return nil, compose.New(compose.CodeWorkerSourceChanged, fmt.Sprintf(
					"container %q is a %s:// worker in %s; compose::add cannot make it a %s:// one. Remove it first (compose::remove worker=%s), then add it again",
					a.key, oldKind, path, a.kind, a.key))
			}
		}
		next := a.merged(old)
		if old != nil && nodeText(old) == nodeText(next) {
			res.Unchanged = append(res.Unchanged, a.key)
			continue
		}
		if err := doc.upsert(a.key, next); err != nil {
			return nil, compose.New(compose.CodeIOError, fmt.Sprintf("edit %s: %v", path, err))
		}
		// Positions moved: read the tree again for the next edit.
		if doc, err = reparse(doc); err != nil {
			return nil, err
		}
		if old == nil {
			res.Added = append(res.Added, a.key)
		} else {
			res.Changed = append(res.Changed, a.key)
		}
	}
	if len(res.Added)+len(res.Changed) == 0 {
		return res, nil
	}
	f, err := doc.commit(d.lookup)
	if err != nil {
		return nil, err
	}
	res.File, res.Edited = f.Path, true
	d.applyNamespace(f)
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

// reparse reads the edited lines back into a tree.
func reparse(d *composeDoc) (*composeDoc, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(d.bytes(), &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf("the edit of %s did not produce valid YAML; the file was not written", d.path))
	}
	d.root = doc.Content[0]
	return d, nil
}

// kindOf reads the source kind of a container node's worker: value.
func kindOf(n *yaml.Node) composefile.SourceKind {
	w := child(n, "worker")
	if w == nil {
		return ""
	}
	switch {
	case strings.HasPrefix(w.Value, "path://"):
		return composefile.SourcePath
	case strings.HasPrefix(w.Value, "package://"):
		return composefile.SourcePackage
	}
	return ""
}

// noFileForAdd explains what to write when compose::add has no file to
// edit: it only edits a compose file that exists.
func noFileForAdd(cwd string, adds []*addition) error {
	var b strings.Builder
	b.WriteString("containers:\n")
	for _, a := range adds {
		lines, err := render(a.key, a.merged(nil), 2, 2)
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
}

// fnRemove takes a container out of the file, stops it, and runs the
// idempotent up of the project that follows.
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
	doc, err := readDoc(path)
	if err != nil {
		return nil, err
	}
	if doc.existingNode(key) == nil {
		f, lerr := composefile.Load(path, d.lookup)
		if lerr != nil {
			return nil, lerr
		}
		return nil, unknownContainer(f, key)
	}
	if err := doc.delete(key); err != nil {
		return nil, err
	}
	f, err := doc.commit(d.lookup)
	if err != nil {
		return nil, err
	}
	d.applyNamespace(f)
	res := &removeResult{File: f.Path, Removed: key}
	p := d.loadedProject(f.Path)
	if p == nil {
		return res, nil
	}
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

// fnUpdate re-resolves package:// workers. Without the registry client
// (a later step) a package cannot be resolved: the call says so with
// PACKAGE_NOT_RESOLVED and changes nothing; a path:// target is
// NOT_A_PACKAGE_CONTAINER.
func (d *Daemon) fnUpdate(_ context.Context, r *request) (any, error) {
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
	var targets []string
	if len(names) == 0 {
		for _, key := range f.Order {
			if f.Containers[key].Source.Kind == composefile.SourcePackage {
				targets = append(targets, key)
			}
		}
		if len(targets) == 0 {
			return map[string]any{"file": f.Path, "updated": []any{}}, nil
		}
	}
	for _, n := range names {
		key, _, _ := strings.Cut(n, "@")
		c, ok := f.Containers[key]
		if !ok {
			return nil, unknownContainer(f, key)
		}
		if c.Source.Kind != composefile.SourcePackage {
			return nil, compose.New(compose.CodeNotAPackageContainer, fmt.Sprintf(
				"container %q is a path:// worker; compose::update updates package:// workers only (a path:// worker runs what its directory holds)", key))
		}
		targets = append(targets, key)
	}
	return nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
		"compose::update needs the package registry to resolve %s, and this build of Compose has no registry client yet; nothing was changed",
		strings.Join(targets, ", ")))
}

package daemon

import (
	"context"
	"fmt"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/fileedit"
	"github.com/iii-sandbox/iii/compose/lockfile"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/compose/yamlbuild"
)

// maxGraphSteps bounds a dependency expansion (a registry whose
// constraints never settle).
const maxGraphSteps = 10_000

// graphNode is one dependency a registry root pulls in: a container named
// after the package, in the root's registry, pinned to an exact version.
type graphNode struct {
	key    string
	worker string
	entry  *lockfile.Entry // nil for a container the file already declares
	// deps are the containers it starts after.
	deps []string
	// declared: the file declares this container already (by hand, or as
	// another root); it is shared, not generated again.
	declared bool
}

// expand resolves the registry dependencies of a root (resolved to ver)
// transitively. Each dependency is pinned to the highest version every
// selector naming it admits; engine-kind dependencies are built into the
// engine and skipped, with their edges; image-kind ones cannot run. A
// dependency the file already declares under its name (and that repin
// does not allow to re-pin) is shared as it is. It returns the generated
// nodes by container key and the root's direct edges.
func (r *resolver) expand(ctx context.Context, root string, src composefile.Source, ver *registry.Version,
	f *composefile.File, repin map[string]bool) (map[string]*graphNode, []string, error) {
	cons := map[string][]string{}
	requiredBy := map[string][]string{}
	nodes := map[string]*graphNode{}
	skipped := map[string]bool{}
	var queue []string
	enqueue := func(from string, v *registry.Version) []string {
		var edges []string
		for _, dep := range sortedMapKeys(v.Dependencies) {
			if dep == src.Name {
				continue // a dependency on the root itself is the root
			}
			sel := v.Dependencies[dep]
			if !slices.Contains(cons[dep], sel) {
				cons[dep] = append(cons[dep], sel)
				requiredBy[dep] = append(requiredBy[dep], from+" needs "+sel)
			}
			queue = append(queue, dep)
			edges = append(edges, dep)
		}
		return edges
	}
	rootEdges := enqueue(root, ver)
	for steps := 0; len(queue) > 0; steps++ {
		if steps > maxGraphSteps {
			return nil, nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf("the dependencies of %s do not settle on versions", root))
		}
		name := queue[0]
		queue = queue[1:]
		if skipped[name] {
			continue
		}
		dsrc := composefile.Source{Kind: composefile.SourcePackage, Registry: src.Registry, Name: name}
		worker := workerRef(dsrc, name)
		if c := f.Containers[name]; c != nil && !repin[name] {
			if c.Worker != worker {
				return nil, nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf(
					"%s depends on the package %s, which would be container %q, but the compose file declares %q as %s; rename that container",
					root, worker, name, name, c.Worker))
			}
			if n := nodes[name]; n == nil {
				nodes[name] = &graphNode{key: name, worker: worker, declared: true}
			}
			continue
		}
		loc, err := r.m.location(dsrc)
		if err != nil {
			return nil, nil, fmt.Errorf("dependency %s of %s: %w", name, root, err)
		}
		v, dver, err := r.rr.ResolveAll(ctx, loc, name, cons[name], requiredBy[name])
		if err != nil {
			return nil, nil, err
		}
		if dver.Kind == registry.KindEngine {
			skipped[name] = true
			delete(nodes, name)
			continue
		}
		if n := nodes[name]; n != nil && n.entry != nil && n.entry.Resolved.Version == v {
			continue
		}
		e, err := lockEntry(dsrc, worker, v, v, dver, loc)
		if err != nil {
			return nil, nil, fmt.Errorf("dependency %s of %s: %w", name, root, err)
		}
		nodes[name] = &graphNode{key: name, worker: worker, entry: e, deps: enqueue(name, dver)}
	}
	keep := func(edges []string) []string {
		var out []string
		for _, e := range edges {
			if !skipped[e] && !slices.Contains(out, e) {
				out = append(out, e)
			}
		}
		return out
	}
	for _, n := range nodes {
		n.deps = keep(n.deps)
	}
	return nodes, keep(rootEdges), nil
}

func sortedMapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// generatedKeys are the containers a registry root generated: nodes of a
// graph that are not roots themselves (those were declared explicitly).
func generatedKeys(graphs map[string][]string) map[string]bool {
	out := map[string]bool{}
	for root, nodes := range graphs {
		for _, n := range nodes {
			if n != root {
				out[n] = true
			}
		}
	}
	for root := range graphs {
		delete(out, root)
	}
	return out
}

// graphOf is the graphs: entry of a root: itself and the nodes it
// generated or shares with another root's generated ones. A container the
// user declared is not listed: it is no root's to remove.
func graphOf(root string, nodes map[string]*graphNode, generated map[string]bool) []string {
	out := []string{root}
	for _, k := range sortedMapKeys(nodes) {
		if !nodes[k].declared || generated[k] {
			out = append(out, k)
		}
	}
	return out
}

// generatedAddition is the container a dependency becomes in the file:
// its package pinned exactly, after its own dependencies.
func generatedAddition(n *graphNode) *fileedit.Addition {
	a := &fileedit.Addition{Key: n.key, Kind: composefile.SourcePackage, Generated: true, Src: sourceOf(n.worker),
		Fields: map[string]*yaml.Node{"worker": yamlbuild.Str(n.worker), "version": fileedit.VersionNode(n.entry.Resolved.Version)}}
	if len(n.deps) > 0 {
		a.Fields["start_after"] = fileedit.FlowList(n.deps)
	}
	return a
}

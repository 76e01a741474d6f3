package composefile

import (
	"fmt"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
)

// checkGraph validates start_after once every container is known (a
// dependency may be declared after its dependent).
func (p *parser) checkGraph(f *File) error {
	for _, key := range f.Order {
		c := f.Containers[key]
		for _, d := range c.StartAfter {
			at := &yaml.Node{Line: c.Line}
			if d == key {
				return p.fail(compose.CodeSelfDependency, at, "containers.%s.start_after lists %s itself; remove it", key, key)
			}
			if _, ok := f.Containers[d]; !ok {
				return p.fail(compose.CodeUnknownDependency, at, "containers.%s.start_after names %q, which this file does not declare; declare containers.%s or remove it (declared: %s)",
					key, clip(d, 80), clip(d, 80), strings.Join(f.Order, ", "))
			}
		}
	}
	if cycle := findCycle(f); cycle != nil {
		at := &yaml.Node{Line: f.Containers[cycle[0]].Line}
		return p.fail(compose.CodeDependencyCycle, at, "start_after forms a cycle: %s; remove one of these edges so the workers can start in order",
			strings.Join(cycle, " → "))
	}
	return nil
}

// findCycle returns a dependency cycle as a path that ends where it
// starts (a → b → a), or nil. The search visits containers in file order
// so the reported cycle is stable.
func findCycle(f *File) []string {
	const (
		unvisited = iota
		onStack
		done
	)
	state := make(map[string]int, len(f.Order))
	var stack []string
	var visit func(k string) []string
	visit = func(k string) []string {
		state[k] = onStack
		stack = append(stack, k)
		for _, d := range f.Containers[k].StartAfter {
			switch state[d] {
			case onStack:
				for i, s := range stack {
					if s == d {
						return append(append([]string(nil), stack[i:]...), d)
					}
				}
			case unvisited:
				if c := visit(d); c != nil {
					return c
				}
			}
		}
		stack = stack[:len(stack)-1]
		state[k] = done
		return nil
	}
	for _, k := range f.Order {
		if state[k] == unvisited {
			if c := visit(k); c != nil {
				return c
			}
		}
	}
	return nil
}

// StartOrder returns container keys in an order where every container
// comes after everything it starts after; among containers that are free
// to start, file order decides. With targets, only the targets and their
// transitive dependencies are returned (compose::up container=X). An
// unknown target is UNKNOWN_CONTAINER.
func (f *File) StartOrder(targets ...string) ([]string, error) {
	include, err := f.closure(targets, func(k string) []string { return f.Containers[k].StartAfter })
	if err != nil {
		return nil, err
	}
	return f.topo(include), nil
}

// StartWaves groups StartOrder into waves: every container of a wave
// depends only on containers of earlier waves, so a wave may start
// concurrently once the previous one is ready.
func (f *File) StartWaves(targets ...string) ([][]string, error) {
	order, err := f.StartOrder(targets...)
	if err != nil {
		return nil, err
	}
	level := make(map[string]int, len(order))
	var waves [][]string
	for _, k := range order {
		l := 0
		for _, d := range f.Containers[k].StartAfter {
			if dl, ok := level[d]; ok && dl+1 > l {
				l = dl + 1
			}
		}
		level[k] = l
		for len(waves) <= l {
			waves = append(waves, nil)
		}
		waves[l] = append(waves[l], k)
	}
	return waves, nil
}

// Dependents returns every container that starts after key, directly or
// transitively, in start order (key itself excluded). Stop them in
// reverse before key (compose::down container=key). An unknown key has
// none.
func (f *File) Dependents(key string) []string {
	if _, ok := f.Containers[key]; !ok {
		return nil
	}
	rev := f.reverseEdges()
	include, _ := f.closure([]string{key}, func(k string) []string { return rev[k] })
	delete(include, key)
	return f.topo(include)
}

func (f *File) reverseEdges() map[string][]string {
	rev := make(map[string][]string, len(f.Order))
	for _, k := range f.Order {
		for _, d := range f.Containers[k].StartAfter {
			rev[d] = append(rev[d], k)
		}
	}
	return rev
}

// closure is targets plus everything reachable through next; no targets
// means every container.
func (f *File) closure(targets []string, next func(string) []string) (map[string]bool, error) {
	include := make(map[string]bool, len(f.Order))
	if len(targets) == 0 {
		for _, k := range f.Order {
			include[k] = true
		}
		return include, nil
	}
	var walk func(k string)
	walk = func(k string) {
		if include[k] {
			return
		}
		include[k] = true
		for _, d := range next(k) {
			if _, ok := f.Containers[d]; ok {
				walk(d)
			}
		}
	}
	for _, t := range targets {
		if _, ok := f.Containers[t]; !ok {
			known := append([]string(nil), f.Order...)
			sort.Strings(known)
			return nil, compose.New(compose.CodeUnknownContainer, fmt.Sprintf("%s declares no container %q; declared: %s", f.Path, t, strings.Join(known, ", ")))
		}
		walk(t)
	}
	return include, nil
}

// topo orders the included containers (Kahn's algorithm, taking the
// earliest container in file order among those whose dependencies are all
// placed). Dependencies outside the set are treated as satisfied.
func (f *File) topo(include map[string]bool) []string {
	index := make(map[string]int, len(f.Order))
	for i, k := range f.Order {
		index[k] = i
	}
	pending := make(map[string]int, len(include))
	rev := f.reverseEdges()
	for k := range include {
		for _, d := range f.Containers[k].StartAfter {
			if include[d] {
				pending[k]++
			}
		}
	}
	var ready []string
	for _, k := range f.Order {
		if include[k] && pending[k] == 0 {
			ready = append(ready, k)
		}
	}
	out := make([]string, 0, len(include))
	for len(ready) > 0 {
		// Take the earliest in file order.
		best := 0
		for i := range ready {
			if index[ready[i]] < index[ready[best]] {
				best = i
			}
		}
		k := ready[best]
		ready = append(ready[:best], ready[best+1:]...)
		out = append(out, k)
		for _, dep := range rev[k] {
			if !include[dep] {
				continue
			}
			pending[dep]--
			if pending[dep] == 0 {
				ready = append(ready, dep)
			}
		}
	}
	return out
}

// WithImplicitStartAfter returns a copy of f in which each container of
// extra also starts after the containers extra lists for it, edges the
// daemon adds itself (a VM worker starts after the sandbox adapter that
// boots it). f is not changed. An edge to an undeclared container, to the
// container itself, or one already written is dropped; an edge that would
// close a cycle is DEPENDENCY_CYCLE, naming the implicit edge.
func (f *File) WithImplicitStartAfter(extra map[string][]string) (*File, error) {
	if len(extra) == 0 {
		return f, nil
	}
	out := *f
	out.Containers = make(map[string]*Container, len(f.Containers))
	for k, c := range f.Containers {
		out.Containers[k] = c
	}
	changed := false
	for _, key := range f.Order {
		deps := extra[key]
		c := f.Containers[key]
		if len(deps) == 0 || c == nil {
			continue
		}
		var add []string
		for _, d := range deps {
			if _, ok := f.Containers[d]; !ok || d == key || contains(c.StartAfter, d) || contains(add, d) {
				continue
			}
			add = append(add, d)
		}
		if len(add) == 0 {
			continue
		}
		cc := *c
		cc.StartAfter = append(append([]string(nil), c.StartAfter...), add...)
		out.Containers[key] = &cc
		changed = true
	}
	if !changed {
		return f, nil
	}
	if cycle := findCycle(&out); cycle != nil {
		return nil, compose.New(compose.CodeDependencyCycle, fmt.Sprintf(
			"%s: start_after forms a cycle once the VM workers start after their sandbox adapter: %s; the adapter must not start after a worker that runs in a VM",
			f.Path, strings.Join(cycle, " → ")))
	}
	return &out, nil
}

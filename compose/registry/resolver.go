package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"

	"github.com/iii-sandbox/iii/compose"
)

// Protocol is how a registry is asked for a package.
type Protocol int

// The two protocols a registry may speak.
const (
	// ProtocolUnknown: not found out yet.
	ProtocolUnknown Protocol = iota
	// ProtocolIndex is ours: GET <registry>/packages/<name>/index.json,
	// resolved here (docs/packages.md).
	ProtocolIndex
	// ProtocolResolve is upstream's: POST <registry>/resolve, resolved by
	// the registry (upstream.go).
	ProtocolResolve
)

func (p Protocol) String() string {
	switch p {
	case ProtocolIndex:
		return "index"
	case ProtocolResolve:
		return "resolve"
	}
	return "unknown"
}

// Resolver resolves selectors for one Compose operation (a start, an
// update, an add): each index is read once and each answer of a resolving
// registry is reused.
//
// Which protocol an HTTP registry speaks is found out by asking: a
// registry on this machine (a loopback host, a directory served by a
// static file server, the tests' registries) is asked for our index first,
// and POST /resolve when the index GET answers 404, 405 or 501; any other
// host (upstream's api.workers.iii.dev is the usual one) is asked POST
// /resolve first, and for the index when that answers 404, 405 or 501
// without upstream's error body. The Client remembers the protocol that
// answered and asks it first from then on (a miss still tries the other,
// so a registry that changes is followed): the cost is one extra request
// for the first package of a registry that speaks the protocol not tried
// first. A directory registry is always the index.
type Resolver struct {
	c       *Client
	target  string
	indexes map[string]*Index
	answers map[string]Resolved            // loc, name, selector → answer
	learned map[string]map[string]Resolved // loc, name → version → what a graph said
}

// NewResolver starts an operation's resolutions; target is the host's
// Rust triple, sent to resolving registries.
func (c *Client) NewResolver(target string) *Resolver {
	return &Resolver{c: c, target: target, indexes: map[string]*Index{},
		answers: map[string]Resolved{}, learned: map[string]map[string]Resolved{}}
}

// Protocol is what loc was found to speak so far.
func (c *Client) Protocol(loc Location) Protocol {
	if loc.IsDir() {
		return ProtocolIndex
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.protos[loc.String()]
}

func (c *Client) remember(loc Location, p Protocol) {
	if loc.IsDir() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.protos == nil {
		c.protos = map[string]Protocol{}
	}
	c.protos[loc.String()] = p
}

// Protocol is what loc was found to speak so far.
func (r *Resolver) Protocol(loc Location) Protocol { return r.c.Protocol(loc) }

func key(loc Location, parts ...string) string {
	return loc.String() + "\x00" + strings.Join(parts, "\x00")
}

// Resolve picks the version sel means for package name in loc.
func (r *Resolver) Resolve(ctx context.Context, loc Location, name, sel string) (string, *Version, error) {
	if loc.IsDir() {
		idx, err := r.index(ctx, loc, name)
		if err != nil {
			return "", nil, err
		}
		return idx.Resolve(sel, loc.Describe())
	}
	first := r.c.Protocol(loc)
	if first == ProtocolUnknown {
		first = ProtocolResolve
		if isLoopbackLocation(loc) {
			first = ProtocolIndex
		}
	}
	if first == ProtocolIndex {
		idx, err := r.index(ctx, loc, name)
		if err == nil {
			return idx.Resolve(sel, loc.Describe())
		}
		if !errors.As(err, new(indexNotServed)) {
			return "", nil, err
		}
		v, ver, rerr := r.remote(ctx, loc, name, sel)
		if errors.Is(rerr, errNotSpoken) {
			return "", nil, err
		}
		return v, ver, rerr
	}
	v, ver, err := r.remote(ctx, loc, name, sel)
	if !errors.Is(err, errNotSpoken) {
		return v, ver, err
	}
	idx, err := r.index(ctx, loc, name)
	if err != nil {
		return "", nil, err
	}
	return idx.Resolve(sel, loc.Describe())
}

// errNotSpoken: the registry did not answer POST /resolve as upstream's
// registry does.
var errNotSpoken = errors.New("POST /resolve is not served")

// remote asks loc's POST /resolve (an answer already given is reused);
// errNotSpoken when the registry does not serve it.
func (r *Resolver) remote(ctx context.Context, loc Location, name, sel string) (string, *Version, error) {
	if a, ok := r.answers[key(loc, name, sel)]; ok {
		return a.Version, a.Spec, nil
	}
	res, outcome, err := r.c.resolveRemote(ctx, loc, name, sel, r.target)
	switch outcome {
	case notSpoken:
		return "", nil, errNotSpoken
	case resolvedOK:
		r.c.remember(loc, ProtocolResolve)
		return r.keep(loc, name, sel, res)
	}
	// An answer in upstream's terms settles the protocol too.
	if compose.CodeOf(err) != compose.CodeRegistryUnreachable {
		r.c.remember(loc, ProtocolResolve)
	}
	return "", nil, err
}

// keep records an answer: the root for its selector, and every package of
// its graph, so a dependency the graph resolved needs no request of its
// own.
func (r *Resolver) keep(loc Location, name, sel string, res *Resolution) (string, *Version, error) {
	for n, p := range res.Packages {
		k := key(loc, n)
		if r.learned[k] == nil {
			r.learned[k] = map[string]Resolved{}
		}
		r.learned[k][p.Version] = p
	}
	root := res.Packages[name]
	r.answers[key(loc, name, sel)] = root
	return root.Version, root.Spec, nil
}

func (r *Resolver) index(ctx context.Context, loc Location, name string) (*Index, error) {
	k := key(loc, name)
	if idx := r.indexes[k]; idx != nil {
		return idx, nil
	}
	idx, err := r.c.Index(ctx, loc, name)
	if err != nil {
		return nil, err
	}
	r.c.remember(loc, ProtocolIndex)
	r.indexes[k] = idx
	return idx, nil
}

// Latest is the exact version the tag latest means (what compose::add
// writes for an unpinned package).
func (r *Resolver) Latest(ctx context.Context, loc Location, name string) (string, error) {
	v, _, err := r.Resolve(ctx, loc, name, TagLatest)
	if err != nil {
		return "", err
	}
	if _, err := semver.StrictNewVersion(v); err != nil {
		return "", compose.New(compose.CodePackageNotResolved, fmt.Sprintf("%s has no latest version", name))
	}
	return v, nil
}

// ResolveAll picks the highest version that every selector admits (a
// dependency several packages need); why says who needs what, for the
// error. A resolving registry is asked for each selector, and the
// versions earlier answers' graphs chose for the package are candidates
// too: the highest candidate every selector admits wins.
func (r *Resolver) ResolveAll(ctx context.Context, loc Location, name string, sels, why []string) (string, *Version, error) {
	if len(sels) == 1 {
		// A version an earlier answer's graph chose for this package,
		// when the selector admits it: one version per package, as the
		// registry's own resolution has it, and no extra request.
		if r.Protocol(loc) == ProtocolResolve {
			if v, ok := r.fromGraph(loc, name, sels); ok {
				return v.Version, v.Spec, nil
			}
		}
		return r.Resolve(ctx, loc, name, sels[0])
	}
	if r.Protocol(loc) != ProtocolResolve {
		idx, err := r.indexFor(ctx, loc, name)
		if err != nil {
			return "", nil, err
		}
		if idx != nil {
			return resolveAllIndex(idx, sels, why, loc)
		}
	}
	if v, ok := r.fromGraph(loc, name, sels); ok {
		return v.Version, v.Spec, nil
	}
	cands := map[string]Resolved{}
	for _, sel := range sels {
		v, ver, err := r.Resolve(ctx, loc, name, sel)
		if err != nil {
			return "", nil, err
		}
		cands[v] = Resolved{Version: v, Spec: ver}
	}
	if best, ok := r.best(loc, name, cands, sels); ok {
		return best.Version, best.Spec, nil
	}
	return "", nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
		"no version of %s in %s satisfies every package that needs it (%s)", name, loc.Describe(), strings.Join(why, "; ")))
}

// indexFor is the index of name when loc speaks (or, once asked, turns out
// to speak) our format; nil when it resolves by itself.
func (r *Resolver) indexFor(ctx context.Context, loc Location, name string) (*Index, error) {
	if r.Protocol(loc) == ProtocolUnknown {
		// Find out with the most common selector; its answer is kept.
		if _, _, err := r.Resolve(ctx, loc, name, TagLatest); err != nil {
			return nil, err
		}
	}
	if r.Protocol(loc) == ProtocolResolve {
		return nil, nil
	}
	return r.index(ctx, loc, name)
}

func (r *Resolver) fromGraph(loc Location, name string, sels []string) (Resolved, bool) {
	learned := r.learned[key(loc, name)]
	if len(learned) == 1 {
		// The one version a graph chose for a dependency is what its
		// edge's tag (latest, say) meant to the registry.
		for _, v := range learned {
			if r.admitsAll(loc, name, v.Version, sels, true) {
				return v, true
			}
		}
	}
	return r.best(loc, name, learned, sels)
}

func (r *Resolver) admitsAll(loc Location, name, v string, sels []string, tagsFree bool) bool {
	sv, err := semver.StrictNewVersion(v)
	if err != nil {
		return false
	}
	for _, sel := range sels {
		if IsTag(sel) {
			if tagsFree {
				continue
			}
			if a, asked := r.answers[key(loc, name, sel)]; !asked || a.Version != v {
				return false
			}
			continue
		}
		c, err := semver.NewConstraint(sel)
		if err != nil || !c.Check(sv) {
			return false
		}
	}
	return true
}

// best is the highest candidate every selector admits. A tag admits only
// what the registry answered for it.
func (r *Resolver) best(loc Location, name string, cands map[string]Resolved, sels []string) (Resolved, bool) {
	var vs []*semver.Version
	for v := range cands {
		if sv, err := semver.StrictNewVersion(v); err == nil {
			vs = append(vs, sv)
		}
	}
	slices.SortFunc(vs, func(a, b *semver.Version) int { return b.Compare(a) })
	for _, sv := range vs {
		if r.admitsAll(loc, name, sv.Original(), sels, false) {
			return cands[sv.Original()], true
		}
	}
	return Resolved{}, false
}

// resolveAllIndex picks, in an index, the highest version every selector
// admits.
func resolveAllIndex(idx *Index, sels, why []string, loc Location) (string, *Version, error) {
	all := idx.SortedVersions()
	for i := len(all) - 1; i >= 0; i-- {
		v := all[i].Original()
		ok := true
		for _, sel := range sels {
			ok = ok && idx.Admits(sel, all[i])
		}
		if ok {
			return v, idx.Versions[v], nil
		}
	}
	return "", nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
		"no version of %s in %s satisfies every package that needs it (%s)", idx.Name, loc.Describe(), strings.Join(why, "; ")))
}

// Admits reports whether sel (a tag, an exact version or a range) admits
// version v of the index.
func (idx *Index) Admits(sel string, v *semver.Version) bool {
	if t, ok := idx.Tags[sel]; ok {
		return t == v.Original()
	}
	if sel == TagLatest {
		return idx.Latest() == v.Original()
	}
	c, err := semver.NewConstraint(sel)
	return err == nil && c.Check(v)
}

func isLoopbackLocation(loc Location) bool {
	if loc.base == nil {
		return false
	}
	h := loc.base.Host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	return IsLoopback(h)
}

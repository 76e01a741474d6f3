package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"

	"github.com/iii-sandbox/iii/compose"
)

// Upstream's registry protocol (spec standard-workers.md §6): the registry
// resolves a selector itself. Compose POSTs {worker, version, target} to
// <registry>/resolve and gets the resolved version and its dependency
// graph back; artefacts are absolute URLs of release tarballs.

// ResolveTimeout bounds one POST /resolve, as upstream's client does.
const ResolveTimeout = 60 * time.Second

// resolveRequest is the body of POST /resolve.
type resolveRequest struct {
	Worker  string `json:"worker"`
	Version string `json:"version"`
	Target  string `json:"target"`
}

// ResolveAnswer is the body of a 200 answer to POST /resolve. Fields
// Compose does not use are ignored.
type ResolveAnswer struct {
	Root struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"root"`
	Target string       `json:"target"`
	Graph  []GraphEntry `json:"graph"`
	Edges  []GraphEdge  `json:"edges"`
}

// GraphEntry is one package of a resolve answer's graph.
type GraphEntry struct {
	Name    string          `json:"name"`
	Type    string          `json:"type"`
	Version string          `json:"version"`
	Repo    string          `json:"repo"`
	Config  json.RawMessage `json:"config"`
	// Binaries are keyed by Rust target triple (type binary).
	Binaries map[string]struct {
		URL    string `json:"url"`
		SHA256 string `json:"sha256"`
	} `json:"binaries"`
	Image string `json:"image"`
	// ArchiveURL and SHA256 are a bundle's one archive.
	ArchiveURL   string            `json:"archive_url"`
	SHA256       string            `json:"sha256"`
	Dependencies map[string]string `json:"dependencies"`
}

// GraphEdge says package From needs To in Range.
type GraphEdge struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Range string `json:"range"`
}

// Resolution is a checked resolve answer in Compose's terms: every
// package of the graph as a Version (kind, artefacts, default config,
// dependencies from the edges and the entry's own list).
type Resolution struct {
	// Name and Version are the root's.
	Name, Version string
	// Packages are the graph's entries by name.
	Packages map[string]Resolved
}

// Resolved is one package version of a resolve answer.
type Resolved struct {
	Version string
	Spec    *Version
}

// upstreamError is upstream's error body.
type upstreamError struct {
	Error *struct {
		Code      string   `json:"code"`
		Message   string   `json:"message"`
		Fix       string   `json:"fix"`
		Available []string `json:"available"`
	} `json:"error"`
}

// DecodeResolve checks a resolve answer for package name on target, from
// source (the registry, for messages). Names, versions and target triples
// must be path-safe (REGISTRY_NAME_REFUSED); anything else malformed is
// PACKAGE_NOT_RESOLVED naming the problem. Digests are accepted in either
// case and kept lower-case, as the index format and the lock write them.
func DecodeResolve(data []byte, name, target, source string) (*Resolution, error) {
	where := source + " (POST /resolve for " + clip(name, 80) + ")"
	if len(data) > MaxIndexSize {
		return nil, badIndex(where, "the answer is larger than %d MiB", MaxIndexSize>>20)
	}
	var a ResolveAnswer
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&a); err != nil {
		return nil, badIndex(where, "not valid JSON: %v", err)
	}
	if dec.More() {
		return nil, badIndex(where, "more than one JSON value")
	}
	if !PathSafe(a.Root.Name) {
		return nil, refused(where, "root name", a.Root.Name)
	}
	if a.Root.Name != name {
		return nil, badIndex(where, "it resolved %q, not %q", clip(a.Root.Name, 80), name)
	}
	if err := checkVersion(where, a.Root.Version); err != nil {
		return nil, err
	}
	if a.Target != "" && !PathSafe(a.Target) {
		return nil, refused(where, "target triple", a.Target)
	}
	res := &Resolution{Name: a.Root.Name, Version: a.Root.Version, Packages: map[string]Resolved{}}
	for _, g := range a.Graph {
		if !PathSafe(g.Name) {
			return nil, refused(where, "package name", g.Name)
		}
		if err := checkVersion(where, g.Version); err != nil {
			return nil, err
		}
		if prev, ok := res.Packages[g.Name]; ok && prev.Version != g.Version {
			return nil, badIndex(where, "the graph lists %s twice (%s and %s)", g.Name, prev.Version, g.Version)
		}
		v, err := graphVersion(where, g, target)
		if err != nil {
			return nil, err
		}
		res.Packages[g.Name] = Resolved{Version: g.Version, Spec: v}
	}
	root, ok := res.Packages[name]
	if !ok {
		return nil, badIndex(where, "the graph has no entry for %s", name)
	}
	if root.Version != a.Root.Version {
		return nil, badIndex(where, "root is %s %s but the graph lists %s", name, a.Root.Version, root.Version)
	}
	for _, e := range a.Edges {
		for _, n := range []string{e.From, e.To} {
			if !PathSafe(n) {
				return nil, refused(where, "package name of an edge", n)
			}
		}
		if err := CheckSelector(e.Range); err != nil {
			return nil, badIndex(where, "edge %s → %s: %v", e.From, e.To, err)
		}
		if from, ok := res.Packages[e.From]; ok && e.To != e.From {
			from.Spec.Dependencies[e.To] = e.Range
		}
	}
	return res, nil
}

func checkVersion(where, v string) error {
	if !PathSafe(v) {
		return refused(where, "version", v)
	}
	if _, err := semver.StrictNewVersion(v); err != nil {
		return badIndex(where, "version %q is not a semantic version (MAJOR.MINOR.PATCH)", clip(v, 40))
	}
	return nil
}

// graphVersion maps a graph entry onto the index format's Version: a
// binary's artefacts are its binaries; a bundle's one archive is listed
// under the target asked for (a bundle runs in a VM, whatever the host);
// engine and image entries carry none (Compose refuses them later with
// its usual codes).
func graphVersion(where string, g GraphEntry, target string) (*Version, error) {
	v := &Version{Kind: g.Type, Artifacts: map[string]Artifact{}, Dependencies: map[string]string{}, DefaultConfig: g.Config}
	switch g.Type {
	case KindBinary, KindBundle, KindEngine, KindImage:
	default:
		return nil, badIndex(where, "%s %s: type %q is not binary, bundle, engine or image", g.Name, g.Version, clip(g.Type, 40))
	}
	add := func(t, u, sum string) error {
		if !PathSafe(t) {
			return refused(where, "target triple of "+g.Name+" "+g.Version, t)
		}
		if err := checkArtifactURL(u); err != nil {
			return badIndex(where, "%s %s: the %s artefact url %q: %v", g.Name, g.Version, t, clip(u, 160), err)
		}
		low := strings.ToLower(sum)
		if !ValidSHA256(low) {
			return badIndex(where, "%s %s: the %s artefact's sha256 %q is not 64 hex digits", g.Name, g.Version, t, clip(sum, 80))
		}
		v.Artifacts[t] = Artifact{URL: u, SHA256: low}
		return nil
	}
	switch g.Type {
	case KindBinary:
		for t, b := range g.Binaries {
			if err := add(t, b.URL, b.SHA256); err != nil {
				return nil, err
			}
		}
	case KindBundle:
		if g.ArchiveURL != "" || g.SHA256 != "" {
			if !PathSafe(target) {
				return nil, refused(where, "target triple", target)
			}
			if err := add(target, g.ArchiveURL, g.SHA256); err != nil {
				return nil, err
			}
		}
	}
	for dep, sel := range g.Dependencies {
		if !PathSafe(dep) {
			return nil, refused(where, "dependency of "+g.Name+" "+g.Version, dep)
		}
		if err := CheckSelector(sel); err != nil {
			return nil, badIndex(where, "%s %s: dependency %s: %v", g.Name, g.Version, dep, err)
		}
		if dep != g.Name {
			v.Dependencies[dep] = sel
		}
	}
	if len(bytes.TrimSpace(v.DefaultConfig)) == 0 {
		v.DefaultConfig = json.RawMessage("null")
	}
	return v, nil
}

// checkArtifactURL: upstream's artefacts are absolute; https, or http to
// this machine (a registry the tests run).
func checkArtifactURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || s == "" {
		return fmt.Errorf("not a URL")
	}
	switch {
	case u.Scheme == "https" && u.Host != "":
	case u.Scheme == "http" && u.Host != "" && IsLoopback(u.Host):
	default:
		return fmt.Errorf("an artefact must be an absolute https:// URL (http:// only on this machine)")
	}
	return nil
}

// resolveOutcome tells the protocol detection what a POST /resolve said.
type resolveOutcome int

const (
	resolvedOK resolveOutcome = iota
	// notSpoken: 404, 405 or 501 without upstream's error body, as a
	// static file server answers: the host may speak our index format.
	notSpoken
	// failed: an answer in upstream's terms (an error, or a bad answer).
	failed
)

// resolveRemote asks loc's POST /resolve for name at sel on target.
func (c *Client) resolveRemote(ctx context.Context, loc Location, name, sel, target string) (*Resolution, resolveOutcome, error) {
	if !PathSafe(name) {
		return nil, failed, compose.New(compose.CodePackageNotResolved, fmt.Sprintf("%q is not a package name", clip(name, 80)))
	}
	where := loc.base.ResolveReference(&url.URL{Path: "resolve"}).String()
	ctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	defer cancel()
	version := sel
	if version == "" {
		version = "*"
	}
	body, _ := json.Marshal(resolveRequest{Worker: name, Version: version, Target: target})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, where, bytes.NewReader(body))
	if err != nil {
		return nil, failed, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("%s: %v", loc.Describe(), err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, failed, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("%s cannot be reached: %v", loc.Describe(), unwrapURLError(err)))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxIndexSize+1))
	if err != nil {
		return nil, failed, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("%s: reading the answer of %s failed: %v", loc.Describe(), where, unwrapURLError(err)))
	}
	if resp.StatusCode == http.StatusOK {
		res, err := DecodeResolve(data, name, target, loc.Describe())
		if err != nil {
			return nil, failed, err
		}
		return res, resolvedOK, nil
	}
	var ue upstreamError
	envelope := json.Unmarshal(data, &ue) == nil && ue.Error != nil && ue.Error.Message != ""
	switch {
	case !envelope && (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed || resp.StatusCode == http.StatusNotImplemented):
		return nil, notSpoken, notInRegistry(loc, name)
	case envelope && (strings.EqualFold(ue.Error.Code, "version_not_found") || len(ue.Error.Available) > 0):
		avail := "none"
		if len(ue.Error.Available) > 0 {
			vs := slices.Clone(ue.Error.Available)
			if len(vs) > 50 {
				vs = append(vs[:50], "…")
			}
			for i, v := range vs {
				vs[i] = clip(v, 40)
			}
			avail = strings.Join(vs, ", ")
		}
		return nil, failed, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
			"no version of %s in %s matches %q: %s; available: %s", name, loc.Describe(), sel, upstreamText(ue), avail))
	case resp.StatusCode == http.StatusNotFound:
		return nil, failed, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
			"%s has no worker %q (%s); check the name in worker: (package://<name> or package://<registry-host>/<name>)", loc.Describe(), name, upstreamText(ue)))
	case envelope && resp.StatusCode >= 400 && resp.StatusCode < 500:
		return nil, failed, compose.New(compose.CodePackageNotResolved, fmt.Sprintf(
			"%s refused to resolve %s %q: %s", loc.Describe(), name, sel, upstreamText(ue)))
	}
	msg := fmt.Sprintf("%s answered %s for POST %s", loc.Describe(), resp.Status, where)
	if envelope {
		msg += ": " + upstreamText(ue)
	}
	return nil, failed, compose.New(compose.CodeRegistryUnreachable, msg)
}

func upstreamText(ue upstreamError) string {
	if ue.Error == nil {
		return "no details"
	}
	s := clip(ue.Error.Message, 300)
	if ue.Error.Fix != "" {
		s += " (" + clip(ue.Error.Fix, 300) + ")"
	}
	return s
}

package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/Masterminds/semver/v3"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
)

const upTarget = "x86_64-unknown-linux-gnu"

// upstreamFake speaks upstream's POST /resolve over a table of workers:
// name → version → graph entry (dependencies resolved by the fake, as the
// real registry does). raw, when set for a worker, is answered as it is.
type upstreamFake struct {
	mu       sync.Mutex
	workers  map[string]map[string]GraphEntry
	raw      map[string]func(w http.ResponseWriter)
	requests []resolveRequest
	gets     int
	// edgesOnly leaves the entries' dependencies out: the edges carry them.
	edgesOnly bool
}

func (f *upstreamFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Method != http.MethodPost || r.URL.Path != "/resolve" {
		f.gets++
		http.NotFound(w, r)
		return
	}
	var req resolveRequest
	data, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(data, &req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	f.requests = append(f.requests, req)
	if raw := f.raw[req.Worker]; raw != nil {
		raw(w)
		return
	}
	vs, ok := f.workers[req.Worker]
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"worker %s not found"}}`, req.Worker)
		return
	}
	root, ok := f.pick(req.Worker, req.Version)
	if !ok {
		var avail []string
		for v := range vs {
			avail = append(avail, v)
		}
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": "version_not_found", "message": "no version matches " + req.Version, "available": avail}})
		return
	}
	var a ResolveAnswer
	a.Root.Name, a.Root.Version, a.Target = req.Worker, root.Version, req.Target
	seen := map[string]bool{}
	var walk func(e GraphEntry)
	walk = func(e GraphEntry) {
		if seen[e.Name] {
			return
		}
		seen[e.Name] = true
		deps := e.Dependencies
		if f.edgesOnly {
			e.Dependencies = nil
		}
		a.Graph = append(a.Graph, e)
		for d, rng := range deps {
			a.Edges = append(a.Edges, GraphEdge{From: e.Name, To: d, Range: rng})
			if de, ok := f.pick(d, rng); ok {
				walk(de)
			}
		}
	}
	walk(root)
	_ = json.NewEncoder(w).Encode(a)
}

func (f *upstreamFake) pick(name, sel string) (GraphEntry, bool) {
	var best *semver.Version
	for v := range f.workers[name] {
		sv := semver.MustParse(v)
		switch sel {
		case "latest", "*":
			if sv.Prerelease() != "" {
				continue
			}
		default:
			c, err := semver.NewConstraint(sel)
			if err != nil || !c.Check(sv) {
				continue
			}
		}
		if best == nil || sv.GreaterThan(best) {
			best = sv
		}
	}
	if best == nil {
		return GraphEntry{}, false
	}
	return f.workers[name][best.Original()], true
}

func (f *upstreamFake) count() (posts, gets int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests), f.gets
}

func binEntry(name, version string, deps map[string]string) GraphEntry {
	e := GraphEntry{Name: name, Type: KindBinary, Version: version, Repo: "https://github.com/iii-hq/workers",
		Config: json.RawMessage(`{"adapter":"kv"}`), Dependencies: deps}
	e.Binaries = map[string]struct {
		URL    string `json:"url"`
		SHA256 string `json:"sha256"`
	}{
		upTarget:               {URL: "https://github.com/iii-hq/workers/releases/download/" + name + "/v" + version + "/" + name + "-" + upTarget + ".tar.gz", SHA256: strings.ToUpper(sha[:60]) + "ABCD"},
		"aarch64-apple-darwin": {URL: "https://example.com/" + name + ".tar.gz", SHA256: sha},
	}
	return e
}

func newFake() *upstreamFake {
	return &upstreamFake{workers: map[string]map[string]GraphEntry{
		"state": {
			"0.22.1":      binEntry("state", "0.22.1", map[string]string{"configuration": "^0.21.6"}),
			"0.23.3":      binEntry("state", "0.23.3", map[string]string{"configuration": "^0.21.6"}),
			"0.24.0-rc.1": binEntry("state", "0.24.0-rc.1", nil),
		},
		"configuration": {
			"0.21.7": {Name: "configuration", Type: KindEngine, Version: "0.21.7"},
		},
		"queue": {
			"0.21.26": binEntry("queue", "0.21.26", map[string]string{"helper": "~1.2"}),
		},
		"helper": {
			"1.2.3": binEntry("helper", "1.2.3", nil),
			"1.3.0": binEntry("helper", "1.3.0", nil),
		},
	}, raw: map[string]func(http.ResponseWriter){}}
}

func serve(t *testing.T, h http.Handler) (Location, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	loc, err := HostLocation(strings.TrimPrefix(srv.URL, "http://"))
	assert.NilError(t, err)
	return loc, srv
}

// TestUpstreamResolve: latest, a range and an exact version through POST
// /resolve; the request carries worker, version and target; the answer
// becomes a Version (artefacts by triple, digests lower-cased, config as
// the default configuration, dependencies from the entry or the edges).
func TestUpstreamResolve(t *testing.T) {
	for _, edgesOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("edgesOnly=%v", edgesOnly), func(t *testing.T) {
			f := newFake()
			f.edgesOnly = edgesOnly
			loc, _ := serve(t, f)
			r := (&Client{}).NewResolver(upTarget)
			ctx := context.Background()

			v, ver, err := r.Resolve(ctx, loc, "state", "latest")
			assert.NilError(t, err)
			assert.Equal(t, v, "0.23.3")
			assert.Equal(t, r.Protocol(loc), ProtocolResolve)
			assert.Equal(t, ver.Kind, KindBinary)
			assert.Equal(t, ver.Artifacts[upTarget].SHA256, strings.ToLower(strings.ToUpper(sha[:60])+"ABCD"))
			assert.Check(t, ValidSHA256(ver.Artifacts[upTarget].SHA256))
			assert.Check(t, is.Contains(ver.Artifacts[upTarget].URL, "https://github.com/"))
			assert.DeepEqual(t, ver.Dependencies, map[string]string{"configuration": "^0.21.6"})
			assert.Equal(t, string(ver.DefaultConfig), `{"adapter":"kv"}`)
			posts, gets := f.count()
			assert.Equal(t, posts, 1)
			assert.Equal(t, gets, 1, "a loopback registry is asked for our index first")
			assert.DeepEqual(t, f.requests[0], resolveRequest{Worker: "state", Version: "latest", Target: upTarget})

			v, _, err = r.Resolve(ctx, loc, "state", "^0.22")
			assert.NilError(t, err)
			assert.Equal(t, v, "0.22.1")
			v, _, err = r.Resolve(ctx, loc, "state", "0.24.0-rc.1")
			assert.NilError(t, err)
			assert.Equal(t, v, "0.24.0-rc.1")
			latest, err := r.Latest(ctx, loc, "state")
			assert.NilError(t, err)
			assert.Equal(t, latest, "0.23.3")
			posts, gets = f.count()
			assert.Equal(t, posts, 3, "latest was answered already")
			assert.Equal(t, gets, 1, "the protocol is settled once")

			// A dependency the graph resolved: no request of its own;
			// its kind (engine) comes from the graph.
			dv, dver, err := r.ResolveAll(ctx, loc, "configuration", []string{"^0.21.6"}, []string{"state needs ^0.21.6"})
			assert.NilError(t, err)
			assert.Equal(t, dv, "0.21.7")
			assert.Equal(t, dver.Kind, KindEngine)
			_, err = Installable("configuration", dv, dver.Kind, nil, Platform{GOOS: "linux", GOARCH: "amd64"}, false)
			assert.Equal(t, compose.CodeOf(err), compose.CodeEngineWorkerIsBuiltin)

			// A transitive binary dependency through the edges.
			_, qver, err := r.Resolve(ctx, loc, "queue", "*")
			assert.NilError(t, err)
			assert.DeepEqual(t, qver.Dependencies, map[string]string{"helper": "~1.2"})
			before, _ := f.count()
			hv, _, err := r.ResolveAll(ctx, loc, "helper", []string{"~1.2"}, nil)
			assert.NilError(t, err)
			assert.Equal(t, hv, "1.2.3")
			after, _ := f.count()
			assert.Equal(t, after, before, "the graph answered it")
			// Two selectors the graph's version satisfies: kept (one
			// version per package, as the registry resolved it).
			hv, _, err = r.ResolveAll(ctx, loc, "helper", []string{"^1", ">=1.2.3"}, nil)
			assert.NilError(t, err)
			assert.Equal(t, hv, "1.2.3")
			// Ones it does not: each selector is asked, the highest
			// answer all admit wins.
			hv, _, err = r.ResolveAll(ctx, loc, "helper", []string{"^1", ">=1.3"}, nil)
			assert.NilError(t, err)
			assert.Equal(t, hv, "1.3.0")
			_, _, err = r.ResolveAll(ctx, loc, "helper", []string{"~1.2", ">=1.3"}, []string{"a needs ~1.2", "b needs >=1.3"})
			assert.Equal(t, compose.CodeOf(err), compose.CodePackageNotResolved)
			assert.Check(t, is.Contains(err.Error(), "a needs ~1.2; b needs >=1.3"))
		})
	}
}

// TestUpstreamErrors: what the registry refuses, and answers Compose
// refuses, map onto the package codes.
func TestUpstreamErrors(t *testing.T) {
	ctx := context.Background()
	answer := func(status int, body string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}
	}
	good := func(mut func(*ResolveAnswer)) string {
		var a ResolveAnswer
		a.Root.Name, a.Root.Version = "bad", "1.0.0"
		a.Graph = []GraphEntry{binEntry("bad", "1.0.0", nil)}
		mut(&a)
		data, _ := json.Marshal(a)
		return string(data)
	}
	tests := []struct {
		name, worker, sel string
		raw               func(http.ResponseWriter)
		code, contains    string
	}{
		{name: "version not found", worker: "state", sel: "^9", code: compose.CodePackageNotResolved, contains: "available: "},
		{name: "worker not found", worker: "nosuch", sel: "latest", code: compose.CodePackageNotResolved, contains: "worker nosuch not found"},
		{name: "bad json", raw: answer(200, `{"root":`), code: compose.CodePackageNotResolved, contains: "not valid JSON"},
		{name: "two values", raw: answer(200, good(func(*ResolveAnswer) {})+"{}"), code: compose.CodePackageNotResolved, contains: "more than one"},
		{name: "unsafe root", raw: answer(200, `{"root":{"name":"../bad","version":"1.0.0"}}`), code: compose.CodeRegistryNameRefused},
		{name: "other root", raw: answer(200, `{"root":{"name":"other","version":"1.0.0"}}`), code: compose.CodePackageNotResolved, contains: `not "bad"`},
		{name: "unsafe version", raw: answer(200, good(func(a *ResolveAnswer) { a.Root.Version = "1.0.0/../../x"; a.Graph[0].Version = a.Root.Version })), code: compose.CodeRegistryNameRefused},
		{name: "not semver", raw: answer(200, good(func(a *ResolveAnswer) { a.Root.Version = "one"; a.Graph[0].Version = "one" })), code: compose.CodePackageNotResolved},
		{name: "unsafe graph name", raw: answer(200, good(func(a *ResolveAnswer) {
			a.Graph = append(a.Graph, GraphEntry{Name: ".hidden", Type: KindEngine, Version: "1.0.0"})
		})), code: compose.CodeRegistryNameRefused},
		{name: "unsafe triple", raw: answer(200, good(func(a *ResolveAnswer) {
			a.Graph[0].Binaries["../x"] = a.Graph[0].Binaries[upTarget]
		})), code: compose.CodeRegistryNameRefused},
		{name: "unsafe dependency", raw: answer(200, good(func(a *ResolveAnswer) { a.Edges = []GraphEdge{{From: "bad", To: "a/b", Range: "*"}} })), code: compose.CodeRegistryNameRefused},
		{name: "bad edge range", raw: answer(200, good(func(a *ResolveAnswer) { a.Edges = []GraphEdge{{From: "bad", To: "x", Range: "!!"}} })), code: compose.CodePackageNotResolved},
		{name: "bad digest", raw: answer(200, good(func(a *ResolveAnswer) {
			b := a.Graph[0].Binaries[upTarget]
			b.SHA256 = "xyz"
			a.Graph[0].Binaries[upTarget] = b
		})), code: compose.CodePackageNotResolved, contains: "sha256"},
		{name: "plain http artefact", raw: answer(200, good(func(a *ResolveAnswer) {
			b := a.Graph[0].Binaries[upTarget]
			b.URL = "http://example.com/a.tar.gz"
			a.Graph[0].Binaries[upTarget] = b
		})), code: compose.CodePackageNotResolved, contains: "https://"},
		{name: "relative artefact", raw: answer(200, good(func(a *ResolveAnswer) {
			b := a.Graph[0].Binaries[upTarget]
			b.URL = "a.tar.gz"
			a.Graph[0].Binaries[upTarget] = b
		})), code: compose.CodePackageNotResolved},
		{name: "unknown type", raw: answer(200, good(func(a *ResolveAnswer) { a.Graph[0].Type = "wasm" })), code: compose.CodePackageNotResolved},
		{name: "root missing from graph", raw: answer(200, good(func(a *ResolveAnswer) { a.Graph = nil })), code: compose.CodePackageNotResolved, contains: "no entry"},
		{name: "duplicate entry", raw: answer(200, good(func(a *ResolveAnswer) { a.Graph = append(a.Graph, binEntry("bad", "2.0.0", nil)) })), code: compose.CodePackageNotResolved, contains: "twice"},
		{name: "server error", raw: answer(500, `{"error":{"message":"db down","fix":"retry"}}`), code: compose.CodeRegistryUnreachable, contains: "db down (retry)"},
		{name: "bad request", raw: answer(400, `{"error":{"message":"bad target"}}`), code: compose.CodePackageNotResolved, contains: "bad target"},
		{name: "plain 404", raw: answer(404, `not here`), code: compose.CodePackageNotResolved},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			worker := tc.worker
			if worker == "" {
				worker = "bad"
			}
			if tc.raw != nil {
				f.raw[worker] = tc.raw
			}
			loc, _ := serve(t, f)
			sel := tc.sel
			if sel == "" {
				sel = "latest"
			}
			_, _, err := (&Client{}).NewResolver(upTarget).Resolve(ctx, loc, worker, sel)
			assert.Equal(t, compose.CodeOf(err), tc.code, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.contains))
		})
	}

	t.Run("binary missing for this target", func(t *testing.T) {
		f := newFake()
		loc, _ := serve(t, f)
		v, ver, err := (&Client{}).NewResolver(upTarget).Resolve(ctx, loc, "state", "latest")
		assert.NilError(t, err)
		_, err = Installable("state", v, ver.Kind, ver.Targets(), Platform{GOOS: "linux", GOARCH: "arm64"}, false)
		assert.Equal(t, compose.CodeOf(err), compose.CodeUnsupportedPlatform)
		assert.Check(t, is.Contains(err.Error(), upTarget))
	})
	t.Run("image refused", func(t *testing.T) {
		f := newFake()
		f.workers["img"] = map[string]GraphEntry{"1.0.0": {Name: "img", Type: KindImage, Version: "1.0.0", Image: "ghcr.io/x/img:1"}}
		loc, _ := serve(t, f)
		v, ver, err := (&Client{}).NewResolver(upTarget).Resolve(ctx, loc, "img", "latest")
		assert.NilError(t, err)
		_, err = Installable("img", v, ver.Kind, ver.Targets(), Platform{GOOS: "linux", GOARCH: "amd64"}, false)
		assert.Equal(t, compose.CodeOf(err), compose.CodeUnsupportedPackageKind)
	})
	t.Run("bundle archive", func(t *testing.T) {
		f := newFake()
		f.workers["bun"] = map[string]GraphEntry{"1.0.0": {Name: "bun", Type: KindBundle, Version: "1.0.0", ArchiveURL: "https://example.com/bun.tar.gz", SHA256: sha}}
		loc, _ := serve(t, f)
		_, ver, err := (&Client{}).NewResolver(upTarget).Resolve(ctx, loc, "bun", "latest")
		assert.NilError(t, err)
		assert.DeepEqual(t, ver.Artifacts, map[string]Artifact{upTarget: {URL: "https://example.com/bun.tar.gz", SHA256: sha}})
	})
	t.Run("unreachable", func(t *testing.T) {
		loc, srv := serve(t, newFake())
		srv.Close()
		_, _, err := (&Client{}).NewResolver(upTarget).Resolve(ctx, loc, "state", "latest")
		assert.Equal(t, compose.CodeOf(err), compose.CodeRegistryUnreachable, "%v", err)
	})
}

// TestProtocolOrder: a host that is not this machine is asked POST
// /resolve first, and falls back to our index when that is not served; a
// loopback registry serving our index is never POSTed to.
func TestProtocolOrder(t *testing.T) {
	ctx := context.Background()
	idx := fmt.Sprintf(`{"name":"pkg","kind":"binary","versions":{"1.0.0":{"artifacts":{%q:{"url":"a.tar.gz","sha256":%q}}}}}`, upTarget, sha)
	var mu sync.Mutex
	var seen []string
	mux := http.NewServeMux()
	mux.HandleFunc("/packages/pkg/index.json", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, idx)
	})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		mux.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	reset := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := seen
		seen = nil
		return out
	}

	// Loopback: the index, no POST.
	loc, err := HostLocation(strings.TrimPrefix(srv.URL, "http://"))
	assert.NilError(t, err)
	r := (&Client{}).NewResolver(upTarget)
	v, _, err := r.Resolve(ctx, loc, "pkg", "latest")
	assert.NilError(t, err)
	assert.Equal(t, v, "1.0.0")
	assert.Equal(t, r.Protocol(loc), ProtocolIndex)
	assert.DeepEqual(t, reset(), []string{"GET /packages/pkg/index.json"})
	_, _, err = r.Resolve(ctx, loc, "nosuch", "latest")
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageNotResolved)
	// Remembered: the index first; a miss still tries the other protocol.
	assert.DeepEqual(t, reset(), []string{"GET /packages/nosuch/index.json", "POST /resolve"})
	reset()

	// Another host (dialled to the test server): POST /resolve first,
	// then the index; the second package goes straight to the index.
	addr := srv.Listener.Addr().String()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}}
	remote, err := ParseLocation("http://registry.example/")
	assert.NilError(t, err)
	r = (&Client{HTTP: hc}).NewResolver(upTarget)
	v, _, err = r.Resolve(ctx, remote, "pkg", "^1")
	assert.NilError(t, err)
	assert.Equal(t, v, "1.0.0")
	assert.DeepEqual(t, reset(), []string{"POST /resolve", "GET /packages/pkg/index.json"})
	// A new operation of the same client starts with what answered.
	cl := &Client{HTTP: hc}
	_, _, err = cl.NewResolver(upTarget).Resolve(ctx, remote, "pkg", "latest")
	assert.NilError(t, err)
	assert.DeepEqual(t, reset(), []string{"POST /resolve", "GET /packages/pkg/index.json"})
	_, _, err = cl.NewResolver(upTarget).Resolve(ctx, remote, "pkg", "latest")
	assert.NilError(t, err)
	assert.DeepEqual(t, reset(), []string{"GET /packages/pkg/index.json"}) // the next operation asks the index first
	_, _, err = cl.NewResolver(upTarget).Resolve(ctx, remote, "nosuch", "latest")
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageNotResolved)
	assert.DeepEqual(t, reset(), []string{"GET /packages/nosuch/index.json", "POST /resolve"})

	// Upstream's registry on another host: one POST per selector.
	f := newFake()
	fsrv := httptest.NewServer(f)
	defer fsrv.Close()
	faddr := fsrv.Listener.Addr().String()
	hc = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, faddr)
	}}}
	r = (&Client{HTTP: hc}).NewResolver(upTarget)
	v, _, err = r.Resolve(ctx, remote, "state", "latest")
	assert.NilError(t, err)
	assert.Equal(t, v, "0.23.3")
	posts, gets := f.count()
	assert.Equal(t, posts, 1)
	assert.Equal(t, gets, 0)
	_, _, err = r.Resolve(ctx, remote, "nosuch", "latest")
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageNotResolved)
	posts, gets = f.count()
	assert.Equal(t, posts, 2)
	assert.Equal(t, gets, 0)
}

// FuzzDecodeResolve: the resolve-answer decoder never panics, and what it
// accepts is path-safe with well-formed digests.
func FuzzDecodeResolve(f *testing.F) {
	var a ResolveAnswer
	a.Root.Name, a.Root.Version = "state", "0.23.3"
	a.Graph = []GraphEntry{binEntry("state", "0.23.3", map[string]string{"configuration": "^0.21.6"}), {Name: "configuration", Type: KindEngine, Version: "0.21.7"},
		{Name: "b", Type: KindBundle, Version: "1.0.0", ArchiveURL: "https://x/b.tgz", SHA256: sha}}
	a.Edges = []GraphEdge{{From: "state", To: "configuration", Range: "^0.21.6"}}
	seed, _ := json.Marshal(a)
	f.Add(seed)
	f.Add([]byte(`{"root":{"name":"state","version":"1.0.0"},"graph":[{"name":"state","type":"engine","version":"1.0.0"}]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"error":{"message":"x"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := DecodeResolve(data, "state", upTarget, "fuzz")
		if err != nil {
			code := compose.CodeOf(err)
			if code != compose.CodePackageNotResolved && code != compose.CodeRegistryNameRefused {
				t.Fatalf("uncoded error %v", err)
			}
			return
		}
		if res.Name != "state" || res.Packages["state"].Spec == nil {
			t.Fatalf("accepted without its root: %+v", res)
		}
		for n, p := range res.Packages {
			if !PathSafe(n) || !PathSafe(p.Version) {
				t.Fatalf("accepted unsafe %q %q", n, p.Version)
			}
			for tr, art := range p.Spec.Artifacts {
				if !PathSafe(tr) || !ValidSHA256(art.SHA256) {
					t.Fatalf("accepted artefact %q %+v", tr, art)
				}
			}
			for d := range p.Spec.Dependencies {
				if !PathSafe(d) {
					t.Fatalf("accepted dependency %q", d)
				}
			}
		}
	})
}

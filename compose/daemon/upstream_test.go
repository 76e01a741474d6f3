package daemon

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/registry"
)

// upstreamRegistry serves the published test registry the way upstream's
// registry does: POST /resolve resolves on the server and answers the
// graph, with absolute artefact URLs (under /files/) and upper-case
// digests; our index files are not served.
type upstreamRegistry struct {
	dir string
	srv *httptest.Server
	mu  sync.Mutex
	log []string
}

func newUpstreamRegistry(t *testing.T) *upstreamRegistry {
	t.Helper()
	u := &upstreamRegistry{dir: publishedRegistry(t)}
	files := http.StripPrefix("/files/", http.FileServer(http.Dir(u.dir)))
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.log = append(u.log, r.Method+" "+r.URL.Path)
		u.mu.Unlock()
		switch {
		case strings.HasPrefix(r.URL.Path, "/files/") && !strings.HasSuffix(r.URL.Path, "index.json"):
			files.ServeHTTP(w, r)
		case r.Method == http.MethodPost && r.URL.Path == "/resolve":
			u.resolve(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstreamRegistry) host() string { return strings.TrimPrefix(u.srv.URL, "http://") }

func (u *upstreamRegistry) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.log...)
}

func (u *upstreamRegistry) index(name string) (*registry.Index, bool) {
	if !registry.PathSafe(name) {
		return nil, false
	}
	data, err := os.ReadFile(filepath.Join(u.dir, "packages", name, "index.json"))
	if err != nil {
		return nil, false
	}
	idx, err := registry.DecodeIndex(data, name, "fixture")
	return idx, err == nil
}

func (u *upstreamRegistry) resolve(w http.ResponseWriter, r *http.Request) {
	var req struct{ Worker, Version, Target string }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"bad body"}}`, http.StatusBadRequest)
		return
	}
	fail := func(status int, body any) {
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	}
	idx, ok := u.index(req.Worker)
	if !ok {
		fail(http.StatusNotFound, map[string]any{"error": map[string]any{"message": "worker " + req.Worker + " not found"}})
		return
	}
	v, ver, err := idx.Resolve(req.Version, "fixture")
	if err != nil {
		var avail []string
		for _, sv := range idx.SortedVersions() {
			avail = append(avail, sv.Original())
		}
		fail(http.StatusNotFound, map[string]any{"error": map[string]any{"code": "version_not_found", "message": "no version matches", "available": avail}})
		return
	}
	type bin struct {
		URL    string `json:"url"`
		SHA256 string `json:"sha256"`
	}
	var graph []map[string]any
	var edges []map[string]string
	seen := map[string]bool{}
	var walk func(name, v string, ver *registry.Version)
	walk = func(name, v string, ver *registry.Version) {
		seen[name] = true
		e := map[string]any{"name": name, "type": ver.Kind, "version": v, "repo": "https://example.com/" + name,
			"config": ver.DefaultConfig, "dependencies": map[string]string{}}
		bins := map[string]bin{}
		for t, a := range ver.Artifacts {
			bins[t] = bin{URL: u.srv.URL + "/files/packages/" + name + "/" + a.URL, SHA256: strings.ToUpper(a.SHA256)}
		}
		if ver.Kind == registry.KindBinary {
			e["binaries"] = bins
		}
		graph = append(graph, e)
		for dep, sel := range ver.Dependencies {
			edges = append(edges, map[string]string{"from": name, "to": dep, "range": sel})
			if seen[dep] {
				continue
			}
			if didx, ok := u.index(dep); ok {
				if dv, dver, err := didx.Resolve(sel, "fixture"); err == nil {
					walk(dep, dv, dver)
				}
			}
		}
	}
	walk(req.Worker, v, ver)
	_ = json.NewEncoder(w).Encode(map[string]any{"root": map[string]string{"name": req.Worker, "version": v}, "target": req.Target, "graph": graph, "edges": edges})
}

// A project resolves, locks, installs and runs packages from a registry
// that speaks upstream's protocol: compose::add host/go-worker adds the
// exact latest and its dependency from the answer's graph (the engine-kind
// configuration skipped), downloads them from the absolute URLs, checks
// the digests (sent upper-case), and the lock records what upstream's
// records. Errors of the registry keep their codes.
func TestUpstreamRegistryHost(t *testing.T) {
	t.Parallel()
	up := newUpstreamRegistry(t)
	host := up.host()
	eng := startEngine(t, "")
	c := eng.caller(t)
	dir := newProject(t, "namespace: ur\ncontainers:\n  gw:\n    worker: package://"+host+"/gw-dep\n    version: '^1.0'\n")
	cache := t.TempDir()
	startDaemon(t, eng.attach(Options{Cwd: dir, Packages: PackageOptions{Cache: cache}}))
	var res opResult
	assert.NilError(t, call(t, c, "ur", "compose::up", nil, &res))
	assert.Equal(t, res.Status, "ok", "%+v", res)
	e := readLock(t, dir).Containers["gw"]
	assert.Equal(t, e.Worker, "package://"+host+"/gw-dep")
	assert.Equal(t, e.Requested, "^1.0")
	assert.Equal(t, e.Resolved.Version, "1.2.0")
	assert.Equal(t, e.Resolved.Type, registry.KindBinary)
	art := e.Resolved.Artifacts[testTarget()]
	assert.Equal(t, art.URL, up.srv.URL+"/files/packages/gw-dep/1.2.0/gw-dep-1.2.0-"+testTarget()+".tar.gz")
	assert.Check(t, registry.ValidSHA256(art.SHA256), "lower-cased: %s", art.SHA256)
	_, err := os.Stat(filepath.Join(cache, "gw-dep-1.2.0-"+testTarget(), "gw-dep"))
	assert.NilError(t, err)
	assert.Check(t, is.Contains(strings.Join(up.requests(), "\n"), "POST /resolve"))

	var add addResult
	assert.NilError(t, call(t, c, "ur", "compose::add", map[string]any{"worker": host + "/go-worker"}, &add))
	assert.Equal(t, add.Up.Status, "ok", "%+v", add.Up)
	l := readLock(t, dir)
	gw := l.Containers["go-worker"]
	assert.Assert(t, gw != nil, "%+v", l.Containers)
	assert.Equal(t, gw.Worker, "package://"+host+"/go-worker")
	assert.Equal(t, gw.Requested, "1.1.0")
	assert.Equal(t, gw.Resolved.Version, "1.1.0")
	assert.DeepEqual(t, gw.Resolved.DefaultConfig, map[string]any{"greeting": "hello", "level": 2})
	dep := l.Containers["gw-dep"]
	assert.Assert(t, dep != nil, "%+v", l.Containers)
	assert.Equal(t, dep.Resolved.Version, "1.2.0")
	assert.Assert(t, l.Containers["configuration"] == nil, "engine kind: nothing to install")
	assert.DeepEqual(t, l.Graphs["go-worker"], []string{"go-worker", "gw-dep"})

	// The first package asked the index (404 here), then POST /resolve;
	// once settled, only POST /resolve and the artefacts.
	reqs := up.requests()
	assert.Equal(t, reqs[0], "GET /packages/gw-dep/index.json")
	for _, r := range reqs[1:] {
		assert.Check(t, r == "POST /resolve" || strings.HasPrefix(r, "GET /files/"), "%v", reqs)
	}

	// update resolves again through the registry; nothing newer.
	var upd struct {
		Restarted bool `json:"restarted"`
	}
	assert.NilError(t, call(t, c, "ur", "compose::update", nil, &upd))
	assert.Check(t, !upd.Restarted)

	err = call(t, c, "ur", "compose::add", map[string]any{"worker": host + "/go-worker@^7"}, nil)
	assert.Equal(t, codeOf(err), compose.CodePackageNotResolved, "%v", err)
	assert.Check(t, is.Contains(err.Error(), "available: 1.0.0, 1.1.0"))
	err = call(t, c, "ur", "compose::add", map[string]any{"worker": host + "/nothing-like-it"}, nil)
	assert.Equal(t, codeOf(err), compose.CodePackageNotResolved, "%v", err)
	err = call(t, c, "ur", "compose::add", map[string]any{"worker": host + "/img"}, nil)
	assert.Equal(t, codeOf(err), compose.CodeUnsupportedPackageKind, "%v", err)
	err = call(t, c, "ur", "compose::add", map[string]any{"worker": host + "/configuration"}, nil)
	assert.Equal(t, codeOf(err), compose.CodeEngineWorkerIsBuiltin, "%v", err)

	// The registry goes away: the locked, cached packages still start.
	up.srv.Close()
	assert.NilError(t, call(t, c, "ur", "compose::restart", nil, &res))
	assert.Equal(t, res.Status, "ok", "%+v", res)
}

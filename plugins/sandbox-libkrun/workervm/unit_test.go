package workervm

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
)

func TestRewriteLoopback(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"ws://127.0.0.1:49134", "ws://10.0.2.2:49134"},
		{"ws://localhost:49134/x", "ws://10.0.2.2:49134/x"},
		{"http://localhost", "http://10.0.2.2"},
		{"postgres://u:p@db:5432/x", "postgres://u:p@db:5432/x"},
		{"ws://localhost.example.com:1", "ws://localhost.example.com:1"},
		{"a=http://127.0.0.1:9,b=http://localhost:8", "a=http://10.0.2.2:9,b=http://10.0.2.2:8"},
		{"plain localhost", "plain localhost"},
	} {
		assert.Check(t, is.Equal(RewriteLoopback(tc.in), tc.want), tc.in)
	}
	for _, tc := range []struct{ in, want string }{
		{"ws://127.0.0.1:49134", "ws://10.0.2.2:49134"},
		{"ws://localhost:5/path?q=1", "ws://10.0.2.2:5/path?q=1"},
		{"wss://localhost", "wss://10.0.2.2"},
		{"ws://engine.internal:49134", "ws://engine.internal:49134"},
	} {
		got, err := GuestEngineURL(tc.in)
		assert.NilError(t, err)
		assert.Check(t, is.Equal(got, tc.want), tc.in)
	}
}

func TestEngineForward(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want *backend.NetForward
		err  string
	}{
		{in: "ws://127.0.0.1:49134", want: &backend.NetForward{GuestPort: 49134, HostAddr: "127.0.0.1:49134", HTTP: true}},
		{in: "ws://localhost:5/path?q=1", want: &backend.NetForward{GuestPort: 5, HostAddr: "127.0.0.1:5", HTTP: true}},
		{in: "wss://localhost", want: &backend.NetForward{GuestPort: 443, HostAddr: "127.0.0.1:443"}},
		{in: "ws://localhost", want: &backend.NetForward{GuestPort: 80, HostAddr: "127.0.0.1:80", HTTP: true}},
		// Not the host's loopback: no forward, the policy decides.
		{in: "ws://engine.internal:49134"},
		{in: "ws://192.0.2.2:49134"},
		{in: "ws://127.0.0.1:0", err: "not 1 to 65535"},
		{in: "ftp://localhost", err: "no default"},
	} {
		got, err := EngineForward(tc.in)
		if tc.err != "" {
			assert.Check(t, is.ErrorContains(err, tc.err), tc.in)
			continue
		}
		assert.NilError(t, err, tc.in)
		assert.Check(t, is.DeepEqual(got, tc.want), tc.in)
	}
	// The forward and the URL the guest dials agree on the port.
	f, _ := EngineForward("ws://localhost:49134")
	u, _ := GuestEngineURL("ws://localhost:49134")
	assert.Equal(t, u, "ws://"+GuestGateway+":"+strconv.Itoa(int(f.GuestPort)))
}

func TestWorkerEnv(t *testing.T) {
	req := &contract.WorkerStartRequest{
		Env: []string{"A=http://localhost:3000", "III_URL=ws://host-path", "III_CONFIG=/host/cfg.yaml", "III_NAMESPACE=shop", "III_ISOLATION=host"},
	}
	env := workerEnv(req, "ws://10.0.2.2:1")
	assert.DeepEqual(t, env, []string{"A=http://10.0.2.2:3000", "III_NAMESPACE=shop",
		"III_ENGINE_URL=ws://10.0.2.2:1", "III_ISOLATION=libkrun", "III_URL=ws://10.0.2.2:1"})
	req.Config = &contract.WorkerConfigFile{FileName: "api.yaml"}
	env = workerEnv(req, "ws://10.0.2.2:1")
	assert.Check(t, is.Contains(env, "III_CONFIG=/run/iii/config/api.yaml"))
}

func TestGuestHostname(t *testing.T) {
	assert.Equal(t, guestHostname("shop-3f2a1b9c-default-api"), "worker-shop-3f2a1b9c-default-api")
	assert.Equal(t, guestHostname("a.b_c"), "worker-a-b-c")
	assert.Equal(t, guestHostname("..."), "worker-vm")
	h := guestHostname(strings.Repeat("x", 48))
	assert.Check(t, len(h) <= 63, h)
}

func TestCheckHostDir(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	assert.NilError(t, err)
	root := filepath.Join(base, "proj")
	worker := filepath.Join(root, "workers", "api")
	state := filepath.Join(root, ".iii", "compose", "default")
	other := filepath.Join(base, "elsewhere")
	for _, d := range []string{worker, state, other} {
		assert.NilError(t, os.MkdirAll(d, 0o755))
	}
	link := filepath.Join(root, "to-elsewhere")
	assert.NilError(t, os.Symlink(other, link))
	roots := resolveHostRoots([]string{root, filepath.Join(base, "missing")})

	got, err := checkHostDir(worker, roots)
	assert.NilError(t, err)
	assert.Equal(t, got, worker)
	got, err = checkHostDir(root, roots)
	assert.NilError(t, err, "path://. (the compose directory itself) is admitted")
	assert.Equal(t, got, root)

	_, err = checkHostDir(other, roots)
	var se *contract.Error
	assert.Assert(t, errors.As(err, &se))
	assert.Equal(t, se.Code, contract.S501)
	assert.Check(t, is.Contains(se.Message, root))
	assert.Check(t, is.Contains(se.Message, "iii call compose::restart worker=sandbox-libkrun"))

	_, err = checkHostDir(link, roots)
	assert.Check(t, contract.IsCode(err, contract.S501), "a link is judged by where it leads: %v", err)
	assert.Check(t, is.Contains(err.Error(), other))

	_, err = checkHostDir(state, roots)
	assert.Check(t, contract.IsCode(err, contract.S001))
	assert.Check(t, is.Contains(err.Error(), ".iii"))

	_, err = checkHostDir(filepath.Join(root, "nope"), roots)
	assert.Check(t, contract.IsCode(err, contract.S001))

	// The default package cache lies inside ~/.iii: as a root it admits
	// the bundles below it, not a .iii directory further down.
	cache := filepath.Join(base, "home", ".iii", "compose", "packages")
	bundle := filepath.Join(cache, "api-1.0.0-x86_64-unknown-linux-gnu")
	nested := filepath.Join(bundle, ".iii")
	assert.NilError(t, os.MkdirAll(nested, 0o755))
	withCache := resolveHostRoots([]string{root, cache})
	got, err = checkHostDir(bundle, withCache)
	assert.NilError(t, err, "a bundle runs from the package cache")
	assert.Equal(t, got, bundle)
	_, err = checkHostDir(nested, withCache)
	assert.Check(t, contract.IsCode(err, contract.S001), "%v", err)

	_, err = checkHostDir(worker, nil)
	assert.Check(t, contract.IsCode(err, contract.S501))
	assert.Check(t, is.Contains(err.Error(), "host_roots is empty"))
}

func TestWorkerImage(t *testing.T) {
	cat := []contract.CatalogImage{{Name: "node", OCIRef: "docker.io/iiidev/node:latest"}}
	img, err := workerImage("node", cat)
	assert.NilError(t, err)
	assert.Equal(t, img.OCIRef, "docker.io/iiidev/node:latest")
	img, err = workerImage("ghcr.io/acme/app:1.2", cat)
	assert.NilError(t, err)
	assert.Equal(t, img.OCIRef, "ghcr.io/acme/app:1.2")
	_, err = workerImage("Not A Ref!", cat)
	assert.Check(t, contract.IsCode(err, contract.S001))
}

func tarNames(t *testing.T, b []byte) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		assert.NilError(t, err)
		out[h.Name] = h
	}
}

// TestCopyRule: the default names are left out at the top of the
// worker's directory only (vendored dependencies below it arrive whole),
// include copies them all the same, .iii goes at any depth and nothing
// includes it, exclude paths go with everything below them.
func TestCopyRule(t *testing.T) {
	const root = "/w"
	for _, tc := range []struct {
		rel     string
		include []string
		why     string // "" = copied
	}{
		{rel: "index.mjs"},
		{rel: "node_modules", why: "dependencies"},
		{rel: "node_modules", include: []string{"node_modules"}},
		{rel: "node_modules/iii-sdk/dist", include: []string{"node_modules"}},
		{rel: "node_modules/iii-sdk/dist/index.mjs", include: []string{"node_modules"}},
		{rel: "vendor/iii-sdk/dist"},
		{rel: "vendor/iii-sdk/node_modules"},
		{rel: "lib/python3.11/site-packages/pkg/__pycache__"},
		{rel: "src/dist"},
		{rel: "crate/target"},
		{rel: "dist", why: "build output"},
		{rel: "dist", include: []string{"node_modules"}, why: "build output"},
		{rel: "dist", include: []string{"dist"}},
		{rel: "target", why: "build output"},
		{rel: ".next", why: "build output"},
		{rel: ".venv", why: "virtual environment"},
		{rel: "__pycache__", why: "bytecode cache"},
		{rel: ".pytest_cache", why: "test cache"},
		{rel: ".git", why: "version control"},
		{rel: ".iii", why: "never copied into a VM"},
		{rel: ".iii", include: []string{".iii"}, why: "never copied into a VM"},
		{rel: "sub/.iii", why: "never copied into a VM"},
		{rel: "node_modules/x/.iii", include: []string{"node_modules"}, why: "never copied into a VM"},
		{rel: "state", why: "listed in exclude"},
		{rel: "state/project-token", why: "listed in exclude"},
		{rel: "stateful"},
		{rel: "Dist"},
	} {
		t.Run(tc.rel+"+"+strings.Join(tc.include, ","), func(t *testing.T) {
			r := copyRule{include: tc.include, exclude: []string{"/w/state"}}
			why, skip := r.skip(tc.rel, root+"/"+tc.rel)
			if tc.why == "" {
				assert.Check(t, !skip, "left out: %s", why)
				return
			}
			assert.Check(t, skip)
			assert.Check(t, is.Contains(why, tc.why))
		})
	}
	r := copyRule{include: []string{"node_modules", "dist"}}
	assert.DeepEqual(t, r.keepTop(), []string{".venv", "target", ".next", "__pycache__", ".pytest_cache", ".git"})
}

func TestCheckInclude(t *testing.T) {
	assert.NilError(t, checkInclude(nil))
	assert.NilError(t, checkInclude([]string{"node_modules", "dist", ".venv", "target", ".git"}))
	err := checkInclude([]string{"dist", "vendor"})
	var se *contract.Error
	assert.Assert(t, errors.As(err, &se))
	assert.Equal(t, se.Code, contract.S001)
	assert.Check(t, is.Contains(se.Message, `include[1] "vendor" is not a name the copy leaves out`))
	assert.Check(t, is.Contains(se.Message, "node_modules, .venv, target, dist"))
}

// TestWorkspaceTar goes through the real copy: the default names are left
// out at the top only, so a vendored node_modules/iii-sdk/dist arrives
// when node_modules is included; .iii (the project token) never does;
// links travel as links; extra excludes and special files are left out;
// every entry left out is named with its reason, and the report says how
// to include it.
func TestWorkspaceTar(t *testing.T) {
	root := t.TempDir()
	for name, content := range map[string]string{
		"index.mjs":                           "x",
		"src/lib.mjs":                         "y",
		"src/dist/out.js":                     "z",
		"dist/bundle.js":                      "b",
		"node_modules/iii-sdk/dist/index.mjs": "sdk",
		"node_modules/iii-sdk/package.json":   "{}",
		"pkg/node_modules/dep/index.js":       "dep",
		".iii/compose/default/project-token":  "secret",
		"sub/.iii/other":                      "secret",
		"node_modules/x/.iii/project-token":   "secret",
		".git/HEAD":                           "ref",
		"py/__pycache__/m.pyc":                "c",
		"state/project-token":                 "secret",
	} {
		p := filepath.Join(root, filepath.FromSlash(name))
		assert.NilError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		assert.NilError(t, os.WriteFile(p, []byte(content), 0o640))
	}
	assert.NilError(t, os.Symlink("/etc/passwd", filepath.Join(root, "passwd")))
	assert.NilError(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600))

	copyOf := func(t *testing.T, include []string) ([]string, tarStats, []byte) {
		var buf bytes.Buffer
		st, err := writeWorkspaceTar(context.Background(), &buf, root, copyRule{include: include, exclude: []string{filepath.Join(root, "state")}})
		assert.NilError(t, err)
		names := tarNames(t, buf.Bytes())
		var got []string
		for n := range names {
			got = append(got, n)
		}
		sort.Strings(got)
		if h := names["passwd"]; h != nil {
			assert.Equal(t, h.Typeflag, byte(tar.TypeSymlink))
			assert.Equal(t, h.Linkname, "/etc/passwd")
		}
		assert.Equal(t, names["index.mjs"].Mode, int64(0o640))
		assert.Check(t, !bytes.Contains(buf.Bytes(), []byte("secret")))
		return got, st, buf.Bytes()
	}

	t.Run("defaults", func(t *testing.T) {
		got, st, _ := copyOf(t, nil)
		assert.DeepEqual(t, got, []string{
			"index.mjs", "passwd", "pkg/", "pkg/node_modules/", "pkg/node_modules/dep/", "pkg/node_modules/dep/index.js",
			"py/", "py/__pycache__/", "py/__pycache__/m.pyc", "src/", "src/dist/", "src/dist/out.js", "src/lib.mjs", "sub/",
		})
		assert.DeepEqual(t, st.Left, []skippedEntry{
			{".git/", "version control"},
			{".iii/", stateDirWhy},
			{"dist/", "build output"},
			{"fifo", "a FIFO, which a copy cannot carry"},
			{"node_modules/", "dependencies: the worker's install step makes them in the guest"},
			{"state/", "listed in exclude"},
			{"sub/.iii/", stateDirWhy},
		})
		assert.Equal(t, st.Skipped, int64(7))
		assert.Equal(t, st.Files, int64(5))

		rep := copyReport(st, "")
		assert.Check(t, is.Contains(rep, "workspace: left out 7 entries: .git/ (version control); .iii/ ("))
		assert.Check(t, is.Contains(rep, "node_modules/ (dependencies: the worker's install step makes them in the guest)"))
		assert.Check(t, is.Contains(rep, "To copy .git, dist, node_modules all the same"))
		assert.Check(t, is.Contains(rep, "list them under copy.include in iii.worker.yaml (worker::start's include)"))
		assert.Check(t, is.Contains(rep, "The worker has no install step, so nothing makes node_modules in the guest"))
		assert.Check(t, !strings.Contains(copyReport(st, "npm ci"), "no install step"))
	})

	t.Run("include node_modules and dist", func(t *testing.T) {
		got, st, _ := copyOf(t, []string{"node_modules", "dist"})
		for _, want := range []string{"dist/bundle.js", "node_modules/iii-sdk/dist/index.mjs", "node_modules/iii-sdk/package.json"} {
			assert.Check(t, slices.Contains(got, want), "%s is not copied: %v", want, got)
		}
		assert.Check(t, !slices.Contains(got, "node_modules/x/.iii/"), ".iii is left out below an included name too")
		assert.DeepEqual(t, st.Left, []skippedEntry{
			{".git/", "version control"},
			{".iii/", stateDirWhy},
			{"fifo", "a FIFO, which a copy cannot carry"},
			{"node_modules/x/.iii/", stateDirWhy},
			{"state/", "listed in exclude"},
			{"sub/.iii/", stateDirWhy},
		})
		rep := copyReport(st, "")
		assert.Check(t, is.Contains(rep, "To copy .git all the same"))
		assert.Check(t, is.Contains(rep, "list it under copy.include"))
		assert.Check(t, !strings.Contains(rep, "no install step"), "node_modules was copied")
	})

	t.Run("nothing left out", func(t *testing.T) {
		assert.Equal(t, copyReport(tarStats{Files: 3}, ""), "")
	})

	t.Run("long lists are cut", func(t *testing.T) {
		var st tarStats
		for i := range maxSkippedListed + 5 {
			st.leave(fmt.Sprintf("f%d", i), false, "a FIFO, which a copy cannot carry")
		}
		assert.Equal(t, len(st.Left), maxSkippedListed)
		assert.Check(t, is.Contains(copyReport(st, ""), "; and 5 more"))
	})
}

func TestLogStore(t *testing.T) {
	dir := t.TempDir()
	now := func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }
	l := openLogStore(dir, now)
	l.rotate = 400
	for i := 0; i < 10; i++ {
		assert.NilError(t, l.add(contract.LogStdout, strings.Repeat("x", 40)))
	}
	l.close()
	entries, next, truncated, more, err := l.read(100, nil)
	assert.NilError(t, err)
	assert.Equal(t, entries[len(entries)-1].Seq, uint64(10))
	assert.Equal(t, next, uint64(10))
	assert.Check(t, truncated, "rotation dropped the oldest entries")
	assert.Check(t, !more)
	assert.Check(t, len(entries) < 10)

	// Numbering goes on after a reopen (an adapter restart).
	l2 := openLogStore(dir, now)
	assert.NilError(t, l2.add(contract.LogSystem, "again"))
	defer l2.close()
	last, _, _, _, err := l2.read(1, nil)
	assert.NilError(t, err)
	assert.DeepEqual(t, last, []contract.WorkerLogEntry{{Seq: 11, Time: "2026-01-02T03:04:05Z", Stream: contract.LogSystem, Message: "again"}})
}

func TestPageLog(t *testing.T) {
	var all []contract.WorkerLogEntry
	for s := uint64(3); s <= 9; s++ {
		all = append(all, contract.WorkerLogEntry{Seq: s, Stream: contract.LogStdout})
	}
	seqs := func(es []contract.WorkerLogEntry) []uint64 {
		var out []uint64
		for _, e := range es {
			out = append(out, e.Seq)
		}
		return out
	}
	u := func(v uint64) *uint64 { return &v }
	for _, tc := range []struct {
		name            string
		tail            uint64
		cursor          *uint64
		want            []uint64
		next            uint64
		truncated, more bool
	}{
		{"tail", 3, nil, []uint64{7, 8, 9}, 9, true, false},
		{"all kept, older rotated", 100, nil, []uint64{3, 4, 5, 6, 7, 8, 9}, 9, true, false},
		{"cursor page", 2, u(4), []uint64{5, 6}, 6, false, true},
		{"cursor at the end", 5, u(9), nil, 9, false, false},
		{"cursor before rotation", 2, u(1), []uint64{3, 4}, 4, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, next, truncated, more, err := pageLog(all, tc.tail, tc.cursor)
			assert.NilError(t, err)
			assert.DeepEqual(t, seqs(got), tc.want)
			assert.Equal(t, next, tc.next)
			assert.Equal(t, truncated, tc.truncated)
			assert.Equal(t, more, tc.more)
		})
	}
}

func TestLineSplitter(t *testing.T) {
	var got []string
	s := &lineSplitter{emit: func(l string) { got = append(got, l) }}
	s.write([]byte("a\r\nb"))
	s.write([]byte("c\n\nd"))
	s.write(bytes.Repeat([]byte("e"), maxLogLine+1))
	s.flush()
	assert.DeepEqual(t, got, []string{"a", "bc", "", "d" + strings.Repeat("e", maxLogLine-1), "ee"})
}

func TestDecodeMeta(t *testing.T) {
	code := 3
	m := &workerMeta{Version: metaVersion, VMID: "a", Name: "n", State: contract.WorkerFailed, ExitCode: &code, Starts: 2, Restarts: 1}
	dir := t.TempDir()
	assert.NilError(t, writeMeta(dir, m))
	b, err := os.ReadFile(filepath.Join(dir, metaName))
	assert.NilError(t, err)
	got, err := decodeMeta(b)
	assert.NilError(t, err)
	assert.DeepEqual(t, got, m)
	for _, bad := range []string{`{}`, `{"version":1,"vm_id":"a","state":"dancing"}`, `{"version":1,"vm_id":"A","state":"stopped"}`,
		`{"version":1,"vm_id":"a","state":"stopped","x":1}`, `{"version":1,"vm_id":"a","state":"stopped"} {}`} {
		_, err := decodeMeta([]byte(bad))
		assert.Check(t, err != nil, bad)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte(`{"version":1,"vm_id":"a","name":"n","state":"running","pid":4,"starts":1,"restarts":0}`))
	f.Add([]byte(`{"version":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err != nil {
			return
		}
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeMeta(out)
		if err != nil || again.VMID != m.VMID || again.State != m.State {
			t.Fatalf("round trip: %v %+v %+v", err, m, again)
		}
	})
}

func FuzzParseLogLine(f *testing.F) {
	f.Add([]byte(`{"seq":1,"time":"t","stream":"stdout","message":"hi"}`))
	f.Add([]byte(`{"seq":0}`))
	f.Add([]byte("not json"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, ok := parseLogLine(b)
		if !ok {
			return
		}
		if e.Seq == 0 {
			t.Fatal("accepted seq 0")
		}
		out, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if again, ok := parseLogLine(out); !ok || again.Seq != e.Seq || again.Stream != e.Stream {
			t.Fatalf("round trip: %+v %+v", e, again)
		}
	})
}

// TestPlanRefusesLongVMID: the VM's socket must fit a unix socket path.
func TestPlanRefusesLongVMID(t *testing.T) {
	root := t.TempDir()
	s := &Set{dir: filepath.Join("/tmp", strings.Repeat("s", 40), "workers"), roots: []string{root}}
	req := &contract.WorkerStartRequest{VMID: strings.Repeat("v", contract.MaxVMIDLen), HostDir: root, Image: "node:20", EngineURL: "ws://127.0.0.1:1"}
	_, err := s.plan(context.Background(), req)
	assert.Check(t, contract.IsCode(err, contract.S001))
	assert.Check(t, is.Contains(err.Error(), "too long"))
}

// TestPlanCredential: the engine credential goes to the host-side forward
// only: never into the guest's environment, and a fresh credential for the
// same worker is the same plan.
func TestPlanCredential(t *testing.T) {
	root := t.TempDir()
	s := &Set{dir: filepath.Join(t.TempDir(), "workers"), roots: []string{root}}
	req := &contract.WorkerStartRequest{VMID: "p-w", HostDir: root, Image: "node:20", EngineURL: "ws://127.0.0.1:49134",
		Command: "node index.mjs", EngineCredential: "secret-credential"}
	pl, err := s.plan(context.Background(), req)
	assert.NilError(t, err)
	assert.Assert(t, pl.forward != nil)
	assert.Equal(t, pl.forward.BearerToken, "secret-credential")
	for _, kv := range pl.env {
		assert.Check(t, !strings.Contains(kv, "secret-credential"), "the credential is in the guest's environment: %s", kv)
	}
	again := *req
	again.EngineCredential = "another"
	pl2, err := s.plan(context.Background(), &again)
	assert.NilError(t, err)
	assert.Equal(t, pl.hash, pl2.hash)
}

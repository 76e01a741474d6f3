package packages

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
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
	"github.com/iii-sandbox/iii/internal/download"
	extract "github.com/iii-sandbox/iii/internal/tarextract"
)

const target = "x86_64-unknown-linux-gnu"

type entry struct {
	name string
	body string
	mode int64
	typ  byte
	link string
	size int64 // when body is empty and size > 0: that many zero bytes
}

func tarGz(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		size := int64(len(e.body))
		if e.size > 0 {
			size = e.size
		}
		if typ != tar.TypeReg {
			size = 0
		}
		assert.NilError(t, tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Size: size, Linkname: e.link}))
		if typ == tar.TypeReg {
			if e.size > 0 {
				_, err := tw.Write(make([]byte, e.size))
				assert.NilError(t, err)
			} else {
				_, err := tw.Write([]byte(e.body))
				assert.NilError(t, err)
			}
		}
	}
	assert.NilError(t, tw.Close())
	assert.NilError(t, zw.Close())
	return buf.Bytes()
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// server serves artefacts by path; tests replace them to tamper.
type server struct {
	mu    sync.Mutex
	files map[string][]byte
	hits  map[string]int
	srv   *httptest.Server
}

func newServer(t *testing.T) *server {
	s := &server{files: map[string][]byte{}, hits: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		data, ok := s.files[r.URL.Path]
		s.hits[r.URL.Path]++
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(data)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *server) put(path string, data []byte) string {
	s.mu.Lock()
	s.files[path] = data
	s.mu.Unlock()
	return s.srv.URL + path
}

func (s *server) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[path]
}

type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) progress(ev Event) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
}

func (r *recorder) phases() []Phase {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Phase
	for _, ev := range r.events {
		if ev.Phase != PhaseProgress {
			out = append(out, ev.Phase)
		}
	}
	r.events = nil
	return out
}

func installer(t *testing.T, rec *recorder) *Installer {
	in := &Installer{Dir: filepath.Join(t.TempDir(), "packages")}
	if rec != nil {
		in.Progress = rec.progress
	}
	return in
}

var goodArchive = []entry{
	{name: "tool", body: "#!/bin/sh\necho tool\n", mode: 0o755},
	{name: "share/", typ: tar.TypeDir, mode: 0o755},
	{name: "share/README", body: "hello"},
	{name: "share/link", typ: tar.TypeSymlink, link: "README"},
}

// A real download over HTTP: verified, unpacked, found again intact; a
// modified cache entry is downloaded again; a changed artefact is refused
// by digest and nothing is installed.
func TestInstallOverHTTP(t *testing.T) {
	s := newServer(t)
	data := tarGz(t, goodArchive...)
	url := s.put("/tool-1.0.0.tar.gz", data)
	rec := &recorder{}
	in := installer(t, rec)
	req := Request{Name: "tool", Version: "1.0.0", Kind: registry.KindBinary, Target: target, URL: url, SHA256: digest(data), Size: int64(len(data))}

	got, err := in.Install(context.Background(), req)
	assert.NilError(t, err)
	assert.Equal(t, got.Dir, filepath.Join(in.Dir, "tool-1.0.0-"+target))
	assert.Equal(t, got.Executable, filepath.Join(got.Dir, "tool"))
	assert.Check(t, !got.Reused)
	assert.DeepEqual(t, rec.phases(), []Phase{PhaseDownload, PhaseVerified, PhaseInstalled})
	out, err := os.ReadFile(filepath.Join(got.Dir, "share", "README"))
	assert.NilError(t, err)
	assert.Equal(t, string(out), "hello")
	assert.Equal(t, s.count("/tool-1.0.0.tar.gz"), 1)

	again, err := in.Install(context.Background(), req)
	assert.NilError(t, err)
	assert.Check(t, again.Reused)
	assert.DeepEqual(t, rec.phases(), []Phase{PhaseReused})
	assert.Equal(t, s.count("/tool-1.0.0.tar.gz"), 1, "an intact entry is not downloaded again")

	// Tamper with the cache entry: it is noticed and downloaded again.
	for _, tamper := range []func(){
		func() { assert.NilError(t, os.WriteFile(got.Executable, []byte("#!/bin/sh\necho evil\n"), 0o755)) },
		func() { assert.NilError(t, os.WriteFile(filepath.Join(got.Dir, "extra"), nil, 0o644)) },
		func() { assert.NilError(t, os.Remove(filepath.Join(got.Dir, "share", "README"))) },
		func() { assert.NilError(t, os.Chmod(got.Executable, 0o644)) },
		func() { assert.NilError(t, os.Remove(filepath.Join(got.Dir, MarkerFile))) },
	} {
		before := s.count("/tool-1.0.0.tar.gz")
		tamper()
		fixed, err := in.Install(context.Background(), req)
		assert.NilError(t, err)
		assert.Check(t, !fixed.Reused)
		phases := rec.phases()
		assert.Equal(t, phases[0], PhaseStale)
		assert.Equal(t, s.count("/tool-1.0.0.tar.gz"), before+1)
		body, err := os.ReadFile(fixed.Executable)
		assert.NilError(t, err)
		assert.Equal(t, string(body), "#!/bin/sh\necho tool\n")
	}

	// The registry's artefact changes under the same digest: refused,
	// and the intact entry stays as it was.
	s.put("/tool-1.0.0.tar.gz", tarGz(t, entry{name: "tool", body: "#!/bin/sh\necho tampered\n", mode: 0o755}))
	other := req
	other.Version = "1.0.1"
	_, err = in.Install(context.Background(), other)
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageDigestMismatch, "%v", err)
	assert.Check(t, is.Contains(err.Error(), fmt.Sprintf("not the %d the registry lists", len(data))), "the size is checked first when the registry lists it")
	_, statErr := os.Stat(filepath.Join(in.Dir, "tool-1.0.1-"+target))
	assert.Check(t, os.IsNotExist(statErr), "nothing installed")
	leftovers, err := filepath.Glob(filepath.Join(in.Dir, ".*"))
	assert.NilError(t, err)
	assert.Equal(t, len(leftovers), 0, "no temporary file left: %v", leftovers)

	// The same without a size: the digest alone refuses it.
	other.Size = 0
	_, err = in.Install(context.Background(), other)
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageDigestMismatch)
	assert.Check(t, is.Contains(err.Error(), "its sha256 is"))
}

func TestInstallFromFile(t *testing.T) {
	data := tarGz(t, entry{name: "bin/svc", body: "x", mode: 0o755}, entry{name: "bin/helper", body: "y", mode: 0o755})
	p := filepath.Join(t.TempDir(), "a.tar.gz")
	assert.NilError(t, os.WriteFile(p, data, 0o644))
	in := installer(t, nil)
	got, err := in.Install(context.Background(), Request{Name: "svc", Version: "2.0.0", Kind: registry.KindBinary, Target: target, URL: "file://" + p, SHA256: digest(data)})
	assert.NilError(t, err)
	assert.Equal(t, got.Executable, filepath.Join(got.Dir, "bin", "svc"), "the executable named like the package wins")
}

// What a package may not be: each refused with its code, nothing left in
// the cache.
func TestInstallRefuses(t *testing.T) {
	s := newServer(t)
	deep := strings.Repeat("d/", MaxDepth) + "f"
	var many []entry
	for i := range MaxEntries + 1 {
		many = append(many, entry{name: "f" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "/" + string(rune('a'+i/26%26)) + string(rune('a'+i/676)), body: ""})
	}
	tests := []struct {
		name    string
		kind    string
		data    []byte
		code    string
		msg     string
		badSize bool
	}{
		{"no executable", registry.KindBinary, tarGz(t, entry{name: "README", body: "hi"}), compose.CodePackageArtifactEmpty, "holds no executable", false},
		{"bundle without manifest", registry.KindBundle, tarGz(t, entry{name: "main.js", body: "x"}), compose.CodePackageArtifactEmpty, "iii.worker.yaml", false},
		{"empty archive", registry.KindBinary, tarGz(t), compose.CodePackageDownloadFailed, "empty", false},
		{"not a tar", registry.KindBinary, []byte("just some bytes, not an archive at all......................................................................................................................................................................................................................................................................................................................................................................................................................................................................................."), compose.CodePackageDownloadFailed, "not a tar", false},
		{"climbs out", registry.KindBinary, tarGz(t, entry{name: "../evil", body: "x", mode: 0o755}), compose.CodePackageDownloadFailed, "climbs out", false},
		{"absolute symlink", registry.KindBinary, tarGz(t, entry{name: "tool", typ: tar.TypeSymlink, link: "/bin/sh"}), compose.CodePackageDownloadFailed, "absolute path", false},
		{"escaping symlink", registry.KindBinary, tarGz(t, entry{name: "a/tool", typ: tar.TypeSymlink, link: "../../etc/passwd"}), compose.CodePackageDownloadFailed, "outside the package", false},
		{"too deep", registry.KindBinary, tarGz(t, entry{name: deep, body: "x", mode: 0o755}), compose.CodePackageDownloadFailed, "levels deep", false},
		{"too many entries", registry.KindBinary, tarGz(t, many...), compose.CodePackageDownloadFailed, "more than 1024 entries", false},
		{"file too large", registry.KindBinary, tarGz(t, entry{name: "tool", size: MaxFileBytes + 1, mode: 0o755}), compose.CodePackageDownloadFailed, "larger than 32 MiB", false},
		{"too large in total", registry.KindBinary, tarGz(t, entry{name: "a", size: MaxFileBytes, mode: 0o755}, entry{name: "b", size: MaxFileBytes}, entry{name: "c", size: 1}), compose.CodePackageDownloadFailed, "larger than 64 MiB", false},
		{"device", registry.KindBinary, tarGz(t, entry{name: "dev", typ: tar.TypeChar}), compose.CodePackageDownloadFailed, "device", false},
		{"size differs", registry.KindBinary, tarGz(t, goodArchive...), compose.CodePackageDigestMismatch, "bytes", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := installer(t, nil)
			url := s.put("/"+strings.ReplaceAll(tc.name, " ", "-"), tc.data)
			req := Request{Name: "tool", Version: "1.0.0", Kind: tc.kind, Target: target, URL: url, SHA256: digest(tc.data)}
			if tc.badSize {
				req.Size = int64(len(tc.data)) - 1
			}
			_, err := in.Install(context.Background(), req)
			assert.Equal(t, compose.CodeOf(err), tc.code, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.msg))
			entries, _ := os.ReadDir(in.Dir)
			assert.Equal(t, len(entries), 0, "the cache is left empty")
		})
	}

	in := installer(t, nil)
	ok := tarGz(t, goodArchive...)
	_, err := in.Install(context.Background(), Request{Name: "tool", Version: "1.0.0", Kind: registry.KindBinary, Target: target, URL: s.srv.URL + "/missing", SHA256: digest(ok)})
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageDownloadFailed)
	assert.Check(t, is.Contains(err.Error(), "404"))
	_, err = in.Install(context.Background(), Request{Name: "tool", Version: "1.0.0", Kind: registry.KindBinary, Target: target, URL: "http://127.0.0.1:1/x", SHA256: digest(ok)})
	assert.Equal(t, compose.CodeOf(err), compose.CodePackageDownloadFailed)
	_, err = in.Install(context.Background(), Request{Name: "../tool", Version: "1.0.0", Kind: registry.KindBinary, Target: target, URL: "http://x", SHA256: digest(ok)})
	assert.Equal(t, compose.CodeOf(err), compose.CodeRegistryNameRefused)
	_, err = in.Install(context.Background(), Request{Name: "tool", Version: "1.0.0", Kind: registry.KindImage, Target: target, URL: "http://x", SHA256: digest(ok)})
	assert.Equal(t, compose.CodeOf(err), compose.CodeUnsupportedPackageKind)
}

func TestBundleInstall(t *testing.T) {
	data := tarGz(t, entry{name: "iii.worker.yaml", body: "name: b\n"}, entry{name: "main.js", body: "x"})
	p := filepath.Join(t.TempDir(), "b.tar.gz")
	assert.NilError(t, os.WriteFile(p, data, 0o644))
	got, err := installer(t, nil).Install(context.Background(), Request{Name: "b", Version: "1.0.0", Kind: registry.KindBundle, Target: target, URL: "file://" + p, SHA256: digest(data)})
	assert.NilError(t, err)
	assert.Equal(t, got.Executable, "")
}

func TestCacheDir(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	home := func() (string, error) { return "/home/u", nil }
	d, err := CacheDir(getenv, home)
	assert.NilError(t, err)
	assert.Equal(t, d, "/home/u/.iii/compose/packages")
	env[EnvStateDir] = "/state"
	d, err = CacheDir(getenv, home)
	assert.NilError(t, err)
	assert.Equal(t, d, "/state/packages")
}

func TestPrinter(t *testing.T) {
	events := []Event{
		{Phase: PhaseDownload, Package: "tool 1.0.0", Target: target, URL: "http://r/x", Total: 4 << 20},
		{Phase: PhaseProgress, Package: "tool 1.0.0", Target: target, Bytes: 0, Total: 4 << 20},
		{Phase: PhaseProgress, Package: "tool 1.0.0", Target: target, Bytes: 1 << 20, Total: 4 << 20},
		{Phase: PhaseProgress, Package: "tool 1.0.0", Target: target, Bytes: 3 << 20, Total: 4 << 20},
		{Phase: PhaseVerified, Package: "tool 1.0.0", Target: target, Bytes: 4 << 20, Total: 4 << 20},
		{Phase: PhaseInstalled, Package: "tool 1.0.0", Target: target, Dir: "/c/tool-1.0.0"},
		{Phase: PhaseReused, Package: "tool 1.0.0", Target: target},
	}
	var plain bytes.Buffer
	p := Printer(&plain, false)
	for _, ev := range events {
		p(ev)
	}
	assert.Equal(t, plain.String(), "tool 1.0.0 (x86_64-unknown-linux-gnu): downloading 4.0 MiB from http://r/x\n"+
		"tool 1.0.0 (x86_64-unknown-linux-gnu): 25% (1.0 MiB of 4.0 MiB)\n"+
		"tool 1.0.0 (x86_64-unknown-linux-gnu): 75% (3.0 MiB of 4.0 MiB)\n"+
		"tool 1.0.0 (x86_64-unknown-linux-gnu): downloaded 4.0 MiB, sha256 verified\n"+
		"tool 1.0.0 (x86_64-unknown-linux-gnu): installed in /c/tool-1.0.0\n"+
		"tool 1.0.0 (x86_64-unknown-linux-gnu): in the package cache, verified\n")
	var tty bytes.Buffer
	p = Printer(&tty, true)
	for _, ev := range events[:5] {
		p(ev)
	}
	out := tty.String()
	assert.Check(t, is.Contains(out, "\rtool 1.0.0 [=======                       ]  25% 1.0 MiB/4.0 MiB"))
	assert.Check(t, is.Contains(out, "\rtool 1.0.0 [==============================] 100% 4.0 MiB/4.0 MiB\n"))
	assert.Check(t, !strings.Contains(out, "downloading"), "the bar replaces the start line")
}

// A download's meter reports in byte steps: at most progressSteps+1
// events for a known size.
func TestProgressSteps(t *testing.T) {
	var n int
	pw := &download.Meter{Total: 1000, Steps: progressSteps, Report: func(int64) { n++ }}
	for range 1000 {
		_, _ = pw.Write([]byte{0})
	}
	assert.Check(t, n <= progressSteps+1 && n >= progressSteps, "%d events", n)
}

// FuzzPrescan: any archive bytes are checked without a panic, and what
// passes the check stays inside the limits.
func FuzzPrescan(f *testing.F) {
	f.Add(tarGz(f, goodArchive...))
	f.Add(tarGz(f, entry{name: "a/../../b", body: "x"}))
	f.Add(tarGz(f, entry{name: "l", typ: tar.TypeSymlink, link: "../x"}))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := extract.Decompress(bytes.NewReader(data))
		if err != nil {
			return
		}
		defer r.Close()
		_ = prescan(io.LimitReader(r, 1<<20))
	})
}

func TestEscapes(t *testing.T) {
	for _, tc := range []struct {
		dir, link string
		out       bool
	}{
		{"/", "a", false}, {"/", "..", true}, {"/a", "..", false}, {"/a", "../..", true},
		{"/a/b", "../c/../../d", false}, {"/a/b", "../../../d", true}, {"/a", "./x/../../y", false}, {"/a", "./x/../../../y", true},
	} {
		assert.Check(t, is.Equal(escapes(tc.dir, tc.link), tc.out), "%s + %s", tc.dir, tc.link)
	}
}

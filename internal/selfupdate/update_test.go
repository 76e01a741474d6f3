package selfupdate

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/compose/packages"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

const testTarget = "x86_64-unknown-linux-gnu"

// script is a stand-in binary: a shell script that prints out on
// `--version` (and whatever it is run with) and exits with code.
func script(out string, code int) string {
	s := "#!/bin/sh\necho '" + out + "'\n"
	if code != 0 {
		s += "echo broken >&2\nexit " + strconv.Itoa(code) + "\n"
	}
	return s
}

// fixture is an installed iii (a script reporting 0.26.0, mode 0750) and
// a release directory with 0.26.0 (iii) and 0.26.1 (iii, iii-cloud;
// latest), published with Publish.
type fixture struct {
	root, inst, exe, rel, home string
	scripts                    map[string]string // "<product> <version>" -> content
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	root := t.TempDir()
	f := &fixture{root: root, inst: filepath.Join(root, "inst"), rel: filepath.Join(root, "rel"), home: filepath.Join(root, "home"), scripts: map[string]string{}}
	f.exe = writeFile(t, filepath.Join(f.inst, "iii"), script("0.26.0", 0), 0o750)
	f.publish(t, "0.26.0", false, map[string]string{"iii": script("0.26.0", 0)})
	f.publish(t, "0.26.1", true, map[string]string{"iii": script("0.26.1", 0), "iii-cloud": script("iii-cloud 0.26.1", 0)})
	return f
}

func (f *fixture) publish(t *testing.T, version string, latest bool, products map[string]string) {
	t.Helper()
	src := filepath.Join(f.root, "build", version)
	var bins []PublishBinary
	for _, product := range slices.Sorted(mapKeys(products)) {
		bins = append(bins, PublishBinary{Path: writeFile(t, filepath.Join(src, product), products[product], 0o755)})
		f.scripts[product+" "+version] = products[product]
	}
	_, err := Publish(f.rel, Publication{Version: version, Target: testTarget, Binaries: bins, Latest: latest})
	assert.NilError(t, err)
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func (f *fixture) options(t *testing.T) Options {
	t.Helper()
	src, err := ParseSource(f.rel)
	assert.NilError(t, err)
	return Options{Executable: f.exe, CurrentVersion: "0.26.0", Source: src, Target: testTarget, Getenv: envMap(map[string]string{"HOME": f.home})}
}

func envMap(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func read(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	assert.NilError(t, err)
	return string(data)
}

// assertOnly checks that dir holds exactly names: no temporary file is
// left behind.
func assertOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	assert.NilError(t, err)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	slices.Sort(names)
	assert.DeepEqual(t, got, names)
}

func TestUpdateReplacesTheBinary(t *testing.T) {
	f := newFixture(t)
	var phases []packages.Phase
	o := f.options(t)
	o.Progress = func(ev packages.Event) { phases = append(phases, ev.Phase) }
	res, err := Update(context.Background(), o)
	assert.NilError(t, err)
	assert.Equal(t, res.Release, "0.26.1")
	assert.Check(t, res.Latest)
	assert.Equal(t, len(res.Products), 1)
	p := res.Products[0]
	assert.Equal(t, p.Status, StatusUpdated)
	assert.Equal(t, p.From, "0.26.0")
	assert.Equal(t, p.To, "0.26.1")
	assert.Equal(t, read(t, f.exe), f.scripts["iii 0.26.1"])
	st, err := os.Stat(f.exe)
	assert.NilError(t, err)
	assert.Equal(t, st.Mode().Perm(), os.FileMode(0o750), "the mode is kept")
	assertOnly(t, f.inst, "iii")
	assert.Equal(t, phases[0], packages.PhaseDownload)
	assert.Equal(t, phases[len(phases)-1], packages.PhaseVerified)
	assert.Check(t, slices.Contains(phases, packages.PhaseProgress))
}

// TestUpdateUpToDate: the running version is the latest: nothing is
// downloaded, nothing changes.
func TestUpdateUpToDate(t *testing.T) {
	f := newFixture(t)
	srv, assets := serve(t, f.rel)
	o := f.options(t)
	o.Source = mustSource(t, srv.URL)
	o.CurrentVersion = "0.26.1"
	before := read(t, f.exe)
	res, err := Update(context.Background(), o)
	assert.NilError(t, err)
	assert.Equal(t, res.Products[0].Status, StatusUpToDate)
	assert.Equal(t, read(t, f.exe), before)
	assert.Equal(t, assets.Load(), int64(0), "no archive was fetched")
	assertOnly(t, f.inst, "iii")
}

// TestUpdateNewerIsLeftAlone: a build newer than the latest release is
// not downgraded unless --version asks for it.
func TestUpdateNewerIsLeftAlone(t *testing.T) {
	f := newFixture(t)
	o := f.options(t)
	o.CurrentVersion = "0.27.0"
	before := read(t, f.exe)
	res, err := Update(context.Background(), o)
	assert.NilError(t, err)
	assert.Equal(t, res.Products[0].Status, StatusNewer)
	assert.Equal(t, read(t, f.exe), before)

	o.Version = "v0.26.1"
	res, err = Update(context.Background(), o)
	assert.NilError(t, err)
	assert.Equal(t, res.Products[0].Status, StatusUpdated)
	assert.Equal(t, read(t, f.exe), f.scripts["iii 0.26.1"])
}

// TestUpdateRollback: --version installs an older release.
func TestUpdateRollback(t *testing.T) {
	f := newFixture(t)
	o := f.options(t)
	_, err := Update(context.Background(), o)
	assert.NilError(t, err)
	o.CurrentVersion = "0.26.1"
	o.Version = "0.26.0"
	res, err := Update(context.Background(), o)
	assert.NilError(t, err)
	assert.Check(t, !res.Latest)
	assert.Equal(t, res.Products[0].Status, StatusUpdated)
	assert.Equal(t, res.Products[0].From, "0.26.1")
	assert.Equal(t, read(t, f.exe), f.scripts["iii 0.26.0"])

	o.Version = "0.9.9"
	_, err = Update(context.Background(), o)
	assert.Equal(t, CodeOf(err), CodeReleaseNotFound, "%v", err)
	assert.Check(t, is.Contains(err.Error(), `no release "0.9.9"; it has 0.26.1, 0.26.0`))
}

// TestUpdateCheck reports and changes nothing.
func TestUpdateCheck(t *testing.T) {
	f := newFixture(t)
	writeFile(t, filepath.Join(f.inst, "iii-cloud"), script("0.26.0", 0), 0o755)
	o := f.options(t)
	o.Check = true
	before, beforeCloud := read(t, f.exe), read(t, filepath.Join(f.inst, "iii-cloud"))
	res, err := Update(context.Background(), o)
	assert.NilError(t, err)
	assert.Equal(t, len(res.Products), 2)
	for _, p := range res.Products {
		assert.Equal(t, p.Status, StatusAvailable, p.Product)
		assert.Check(t, p.Size > 0)
		assert.Check(t, strings.HasPrefix(p.URL, "file://"))
	}
	assert.Equal(t, read(t, f.exe), before)
	assert.Equal(t, read(t, filepath.Join(f.inst, "iii-cloud")), beforeCloud)
	assertOnly(t, f.inst, "iii", "iii-cloud")
}

// TestUpdateDigestMismatch: an archive that differs from the index, by
// content or by size, is refused and the installed binary stays.
func TestUpdateDigestMismatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func([]byte) []byte
		want   string
	}{
		{"one byte", func(b []byte) []byte { b[len(b)/2] ^= 0xff; return b }, "its sha256 is"},
		{"longer", func(b []byte) []byte { return append(b, 0) }, "larger than the"},
		{"shorter", func(b []byte) []byte { return b[:len(b)-1] }, "not the"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			asset := filepath.Join(f.rel, "0.26.1", AssetName("iii", testTarget))
			data, err := os.ReadFile(asset)
			assert.NilError(t, err)
			assert.NilError(t, os.WriteFile(asset, tc.tamper(data), 0o644))
			before := read(t, f.exe)
			_, err = Update(context.Background(), f.options(t))
			assert.Equal(t, CodeOf(err), CodeDigestMismatch, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.want))
			assert.Check(t, is.Contains(err.Error(), "nothing was changed"))
			assert.Equal(t, read(t, f.exe), before)
			assertOnly(t, f.inst, "iii")
		})
	}
}

// TestUpdateMissingAsset: a release without the host's target names the
// target and the assets it has; nothing changes.
func TestUpdateMissingAsset(t *testing.T) {
	f := newFixture(t)
	o := f.options(t)
	o.Target = ""
	o.Getenv = envMap(map[string]string{EnvTarget: "riscv64gc-unknown-linux-gnu"})
	before := read(t, f.exe)
	_, err := Update(context.Background(), o)
	assert.Equal(t, CodeOf(err), CodeAssetNotFound, "%v", err)
	assert.Check(t, is.Contains(err.Error(), "release 0.26.1 has no iii for this host's target riscv64gc-unknown-linux-gnu"))
	assert.Check(t, is.Contains(err.Error(), "it has iii-cloud-x86_64-unknown-linux-gnu.tar.gz, iii-x86_64-unknown-linux-gnu.tar.gz"))
	assert.Equal(t, read(t, f.exe), before)
}

// TestUpdateRefusesUnusableBinaries: a new binary that does not run, or
// that reports another version than its release, never replaces the old.
func TestUpdateRefusesUnusableBinaries(t *testing.T) {
	tests := []struct {
		name, content, want string
	}{
		{"mislabelled", script("0.26.1", 0), "reports 0.26.1, not 0.26.2"},
		{"no version", script("dev build", 0), "reports no version"},
		{"fails", script("0.26.2", 3), "does not run on this host: exit status 3 (broken)"},
		{"not executable", "\x7fELF garbage", "does not run on this host"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.publish(t, "0.26.2", true, map[string]string{"iii": tc.content})
			before := read(t, f.exe)
			_, err := Update(context.Background(), f.options(t))
			assert.Equal(t, CodeOf(err), CodeBinaryUnusable, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.want))
			assert.Equal(t, read(t, f.exe), before)
			assertOnly(t, f.inst, "iii")
		})
	}
}

// TestUpdateArchiveWithoutBinary: an archive that does not hold iii is
// refused with what it holds.
func TestUpdateArchiveWithoutBinary(t *testing.T) {
	f := newFixture(t)
	f.publish(t, "0.26.2", true, map[string]string{"iii": script("0.26.2", 0)})
	// Republish 0.26.2's iii asset as an archive of another file.
	other := writeFile(t, filepath.Join(f.root, "x", "something-else"), "x", 0o755)
	_, err := Publish(f.rel, Publication{Version: "0.26.2", Target: testTarget, Binaries: []PublishBinary{{Path: other, Product: "iii"}}})
	assert.NilError(t, err)
	data, err := os.ReadFile(filepath.Join(f.rel, IndexFile))
	assert.NilError(t, err)
	idx, err := DecodeIndex(data, "x")
	assert.NilError(t, err)
	good := idx.Releases["0.26.2"].Assets[AssetName("iii", testTarget)]
	// Point the asset at an archive holding "something-else".
	bad, err := Publish(filepath.Join(f.root, "bad"), Publication{Version: "0.26.2", Target: testTarget, Binaries: []PublishBinary{{Path: other}}})
	assert.NilError(t, err)
	good.URL, good.SHA256, good.Size = "file://"+filepath.ToSlash(filepath.Join(f.rel, "bad.tar.gz")), bad[0].SHA256, bad[0].Size
	assert.NilError(t, os.Rename(bad[0].Path, filepath.Join(f.rel, "bad.tar.gz")))
	idx.Releases["0.26.2"].Assets[AssetName("iii", testTarget)] = good
	enc, err := encodeIndex(idx)
	assert.NilError(t, err)
	assert.NilError(t, os.WriteFile(filepath.Join(f.rel, IndexFile), enc, 0o644))

	before := read(t, f.exe)
	_, err = Update(context.Background(), f.options(t))
	assert.Equal(t, CodeOf(err), CodeArchiveInvalid, "%v", err)
	assert.Check(t, is.Contains(err.Error(), "no file named iii at its top or one directory down (it holds something-else)"))
	assert.Equal(t, read(t, f.exe), before)
	assertOnly(t, f.inst, "iii")
}

// TestUpdateCloud: iii-cloud beside iii is updated with it; `self` leaves
// it; a release without it says so; asking for it when it is not there
// is an error.
func TestUpdateCloud(t *testing.T) {
	t.Run("updated with iii", func(t *testing.T) {
		f := newFixture(t)
		cloud := writeFile(t, filepath.Join(f.inst, "iii-cloud"), script("iii-cloud 0.26.0", 0), 0o700)
		res, err := Update(context.Background(), f.options(t))
		assert.NilError(t, err)
		assert.Equal(t, len(res.Products), 2)
		assert.Equal(t, res.Products[1].Product, ProductCloud)
		assert.Equal(t, res.Products[1].Status, StatusUpdated)
		assert.Equal(t, res.Products[1].From, "0.26.0")
		assert.Equal(t, read(t, cloud), f.scripts["iii-cloud 0.26.1"])
		st, err := os.Stat(cloud)
		assert.NilError(t, err)
		assert.Equal(t, st.Mode().Perm(), os.FileMode(0o700))
		// A second run finds both up to date.
		o := f.options(t)
		o.CurrentVersion = "0.26.1"
		res, err = Update(context.Background(), o)
		assert.NilError(t, err)
		assert.Equal(t, res.Products[0].Status, StatusUpToDate)
		assert.Equal(t, res.Products[1].Status, StatusUpToDate)
	})
	t.Run("self only", func(t *testing.T) {
		f := newFixture(t)
		cloud := writeFile(t, filepath.Join(f.inst, "iii-cloud"), script("0.26.0", 0), 0o755)
		o := f.options(t)
		o.Only = ProductIII
		res, err := Update(context.Background(), o)
		assert.NilError(t, err)
		assert.Equal(t, len(res.Products), 1)
		assert.Equal(t, read(t, cloud), script("0.26.0", 0))
	})
	t.Run("cloud only", func(t *testing.T) {
		f := newFixture(t)
		cloud := writeFile(t, filepath.Join(f.inst, "iii-cloud"), script("0.26.0", 0), 0o755)
		o := f.options(t)
		o.Only = ProductCloud
		before := read(t, f.exe)
		res, err := Update(context.Background(), o)
		assert.NilError(t, err)
		assert.Equal(t, len(res.Products), 1)
		assert.Equal(t, res.Products[0].Product, ProductCloud)
		assert.Equal(t, read(t, cloud), f.scripts["iii-cloud 0.26.1"])
		assert.Equal(t, read(t, f.exe), before)
	})
	t.Run("not in the release", func(t *testing.T) {
		f := newFixture(t)
		cloud := writeFile(t, filepath.Join(f.inst, "iii-cloud"), script("0.26.1", 0), 0o755)
		o := f.options(t)
		o.CurrentVersion, o.Version = "0.26.1", "0.26.0"
		res, err := Update(context.Background(), o)
		assert.NilError(t, err)
		assert.Equal(t, res.Products[0].Status, StatusUpdated)
		assert.Equal(t, res.Products[1].Status, StatusNotInRelease)
		assert.Equal(t, read(t, cloud), script("0.26.1", 0))

		o.Only = ProductCloud
		_, err = Update(context.Background(), o)
		assert.Equal(t, CodeOf(err), CodeAssetNotFound, "asked for by name, a missing asset is an error: %v", err)
	})
	t.Run("not installed", func(t *testing.T) {
		f := newFixture(t)
		o := f.options(t)
		o.Only = ProductCloud
		_, err := Update(context.Background(), o)
		assert.Equal(t, CodeOf(err), CodeTargetNotInstalled, "%v", err)
		res, err := Update(context.Background(), f.options(t))
		assert.NilError(t, err)
		assert.Equal(t, len(res.Products), 1, "without a target, an absent iii-cloud is not mentioned")
	})
}

// serve serves dir over HTTP on loopback; the counter counts archive
// requests.
func serve(t *testing.T, dir string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var assets atomic.Int64
	fs := http.FileServer(http.Dir(dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, ArchiveSuffix) {
			assets.Add(1)
		}
		fs.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &assets
}

func mustSource(t *testing.T, s string) Source {
	t.Helper()
	src, err := ParseSource(s)
	assert.NilError(t, err)
	return src
}

// TestUpdateOverHTTP: the same release served over HTTP, with relative
// asset urls resolved against the index.
func TestUpdateOverHTTP(t *testing.T) {
	f := newFixture(t)
	srv, assets := serve(t, f.rel)
	o := f.options(t)
	o.Source = mustSource(t, srv.URL)
	res, err := Update(context.Background(), o)
	assert.NilError(t, err)
	assert.Equal(t, res.Products[0].Status, StatusUpdated)
	assert.Equal(t, res.Products[0].URL, srv.URL+"/0.26.1/"+AssetName("iii", testTarget))
	assert.Equal(t, read(t, f.exe), f.scripts["iii 0.26.1"])
	assert.Equal(t, assets.Load(), int64(1))
}

// TestUpdateSourceFailures: a source that cannot be read, or whose index
// is not one, changes nothing and says why.
func TestUpdateSourceFailures(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/missing/", http.NotFound)
	mux.HandleFunc("/broken/index.json", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusBadGateway) })
	mux.HandleFunc("/garbage/index.json", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("<html>")) })
	mux.HandleFunc("/local/index.json", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"releases":{"0.26.1":{"assets":{"iii-` + testTarget + `.tar.gz":{"url":"file:///etc/passwd","sha256":"` + testSHA + `"}}}}}`))
	})
	mux.HandleFunc("/gone/index.json", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"releases":{"0.26.1":{"assets":{"iii-` + testTarget + `.tar.gz":{"url":"nothere.tar.gz","sha256":"` + testSHA + `"}}}}}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	tests := []struct {
		source, code, want string
	}{
		{srv.URL + "/missing", CodeSourceUnreachable, "404 Not Found"},
		{srv.URL + "/broken", CodeSourceUnreachable, "502 Bad Gateway"},
		{srv.URL + "/garbage", CodeIndexInvalid, "not valid JSON"},
		{srv.URL + "/local", CodeIndexInvalid, "may not point at local files"},
		{srv.URL + "/gone", CodeDownloadFailed, "the server answered 404 Not Found"},
		{filepath.Join(t.TempDir(), "nothing"), CodeSourceUnreachable, "is not a directory"},
		{t.TempDir(), CodeSourceUnreachable, "cannot read"},
	}
	for _, tc := range tests {
		t.Run(tc.source, func(t *testing.T) {
			f := newFixture(t)
			o := f.options(t)
			o.Source = mustSource(t, tc.source)
			before := read(t, f.exe)
			_, err := Update(context.Background(), o)
			assert.Equal(t, CodeOf(err), tc.code, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.want))
			assert.Equal(t, read(t, f.exe), before)
			assertOnly(t, f.inst, "iii")
		})
	}
}

// TestUpdateInterrupted: cancelling the context mid-download stops it
// and leaves the installed binary and no temporary file.
func TestUpdateInterrupted(t *testing.T) {
	f := newFixture(t)
	asset := filepath.Join(f.rel, "0.26.1", AssetName("iii", testTarget))
	data, err := os.ReadFile(asset)
	assert.NilError(t, err)
	var wg sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/"+IndexFile {
			http.ServeFile(w, r, filepath.Join(f.rel, IndexFile))
			return
		}
		wg.Add(1)
		defer wg.Done()
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		_, _ = w.Write(data[:len(data)/2])
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest never comes
	}))
	t.Cleanup(func() {
		srv.Close()
		waitfor.Group(t, &wg, waitfor.Default, "the stalled download handler to end")
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := f.options(t)
	o.Source = mustSource(t, srv.URL)
	o.Progress = func(ev packages.Event) {
		if ev.Phase == packages.PhaseProgress && ev.Bytes > 0 {
			cancel()
		}
	}
	before := read(t, f.exe)
	_, err = Update(ctx, o)
	assert.Equal(t, CodeOf(err), CodeDownloadFailed, "%v", err)
	assert.Check(t, is.Contains(err.Error(), "interrupted"))
	assert.Equal(t, read(t, f.exe), before)
	assertOnly(t, f.inst, "iii")
}

// TestUpdateReportsLeftovers: the 0.25 binaries and state are found,
// listed, and still there afterwards.
func TestUpdateReportsLeftovers(t *testing.T) {
	f := newFixture(t)
	worker := writeFile(t, filepath.Join(f.home, ".local", "bin", "iii-worker"), "x", 0o755)
	initBeside := writeFile(t, filepath.Join(f.inst, "iii-init"), "x", 0o755)
	managed := filepath.Join(f.home, ".iii", "managed")
	assert.NilError(t, os.MkdirAll(filepath.Join(managed, "w1"), 0o755))
	libInit := writeFile(t, filepath.Join(f.home, ".iii", "lib", "iii-init"), "x", 0o755)
	keep := writeFile(t, filepath.Join(f.home, ".iii", "lib", "libkrun.so.1"), "x", 0o644)
	images := writeFile(t, filepath.Join(f.home, ".iii", "cache", "images", "x"), "x", 0o644)

	res, err := Update(context.Background(), f.options(t))
	assert.NilError(t, err)
	assert.DeepEqual(t, res.Leftovers.Binaries, []Leftover{{Path: initBeside}, {Path: worker}})
	assert.DeepEqual(t, res.Leftovers.State, []Leftover{{Path: managed, IsDir: true}, {Path: libInit}})
	for _, p := range []string{worker, initBeside, managed, libInit, keep, images} {
		_, err := os.Stat(p)
		assert.NilError(t, err, "%s is still there", p)
	}
}

func TestFindLeftovers(t *testing.T) {
	home := t.TempDir()
	local := filepath.Join(home, ".local", "bin")
	writeFile(t, filepath.Join(local, "iii-worker"), "x", 0o755)
	writeFile(t, filepath.Join(local, "iii-init"), "x", 0o755)
	for _, rel := range leftoverState() {
		if strings.HasSuffix(rel, "iii-init") {
			writeFile(t, filepath.Join(home, rel), "x", 0o755)
			continue
		}
		assert.NilError(t, os.MkdirAll(filepath.Join(home, rel), 0o755))
	}
	// iii installed in ~/.local/bin: each binary is listed once.
	l := FindLeftovers(local, home)
	assert.DeepEqual(t, l.Binaries, []Leftover{{Path: filepath.Join(local, "iii-worker")}, {Path: filepath.Join(local, "iii-init")}})
	assert.Equal(t, len(l.State), 9)
	assert.Equal(t, l.State[0], Leftover{Path: filepath.Join(home, ".iii", "managed"), IsDir: true})
	assert.Equal(t, l.State[6], Leftover{Path: filepath.Join(home, ".iii", "lib", "iii-init")})
	// Through a symlink to the same directory: still once.
	link := filepath.Join(t.TempDir(), "bin")
	assert.NilError(t, os.Symlink(local, link))
	assert.Equal(t, len(FindLeftovers(link, home).Binaries), 2)
	// No home: only beside iii.
	l = FindLeftovers(local, "")
	assert.Equal(t, len(l.Binaries), 2)
	assert.Equal(t, len(l.State), 0)
	assert.Check(t, FindLeftovers(t.TempDir(), t.TempDir()).Empty())
}

// TestCheckPath: the iii a shell would run, compared with the updated
// one, and Homebrew recognised.
func TestCheckPath(t *testing.T) {
	root := t.TempDir()
	exe := writeFile(t, filepath.Join(root, "local", "iii"), "x", 0o755)
	other := writeFile(t, filepath.Join(root, "brew", "iii"), "x", 0o755)
	writeFile(t, filepath.Join(root, "noexec", "iii"), "x", 0o644)
	assert.NilError(t, os.MkdirAll(filepath.Join(root, "dir", "iii"), 0o755))
	link := filepath.Join(root, "links", "iii")
	assert.NilError(t, os.MkdirAll(filepath.Dir(link), 0o755))
	assert.NilError(t, os.Symlink(exe, link))
	join := func(dirs ...string) string {
		for i, d := range dirs {
			dirs[i] = filepath.Join(root, d)
		}
		return strings.Join(dirs, string(os.PathListSeparator))
	}
	tests := []struct {
		name, path, onPath string
		differs            bool
	}{
		{"same", join("local"), exe, false},
		{"skips non-executables and directories", join("noexec", "dir", "local"), exe, false},
		{"symlink to it", join("links"), link, false},
		{"another copy first", join("brew", "local"), other, true},
		{"none", join("noexec"), "", false},
		{"empty", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pc := CheckPath(exe, tc.path)
			assert.Equal(t, pc.OnPath, tc.onPath)
			assert.Equal(t, pc.Differs, tc.differs)
			assert.Check(t, !pc.Homebrew)
		})
	}
	for p, want := range map[string]bool{
		"/opt/homebrew/bin/iii":                  true,
		"/usr/local/Cellar/iii/0.25.0/bin/iii":   true,
		"/home/linuxbrew/.linuxbrew/bin/iii":     true,
		"/usr/local/bin/iii":                     false,
		"/home/u/.local/bin/iii":                 false,
		"/some/prefix/Cellar/iii/0.25.0/bin/iii": true,
		"/usr/local/Homebrew/Library/x/iii":      true,
		"/opt/homebrewish/bin/iii":               false,
	} {
		assert.Equal(t, isHomebrew(p), want, p)
	}
}

// TestWriteError: permission and read-only failures carry the fix.
func TestWriteError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code string
	}{
		{&os.PathError{Op: "open", Path: "/x", Err: os.ErrPermission}, CodeDirNotWritable},
		{&os.LinkError{Op: "rename", Old: "a", New: "b", Err: syscall.EROFS}, CodeDirNotWritable},
		{&os.PathError{Op: "open", Path: "/x", Err: os.ErrNotExist}, CodeReplaceFailed},
	} {
		err := writeError("/opt/bin", "iii", tc.err)
		assert.Equal(t, CodeOf(err), tc.code, "%v", err)
		if tc.code == CodeDirNotWritable {
			assert.Check(t, is.Contains(err.Error(), "iii is installed in /opt/bin, which this user cannot write"))
			assert.Check(t, is.Contains(err.Error(), "sudo iii update"))
			assert.Check(t, is.Contains(err.Error(), "~/.local/bin"))
		}
	}
}

// TestUpdateKeepsOwner: an update run by root on a binary another user
// owns leaves the new binary with that owner, so the user can update it
// again. Only root can hand a file to another user.
func TestUpdateKeepsOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root can give a file another owner")
	}
	f := newFixture(t)
	assert.NilError(t, os.Chown(f.exe, 65534, 65534))
	_, err := Update(context.Background(), f.options(t))
	assert.NilError(t, err)
	st, err := os.Stat(f.exe)
	assert.NilError(t, err)
	sys := st.Sys().(*syscall.Stat_t)
	assert.Equal(t, sys.Uid, uint32(65534))
	assert.Equal(t, sys.Gid, uint32(65534))
	assert.Equal(t, read(t, f.exe), f.scripts["iii 0.26.1"])
}

// TestUpdateUnreachable: nothing listens at the source.
func TestUpdateUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	f := newFixture(t)
	o := f.options(t)
	o.Source = mustSource(t, url)
	_, err := Update(context.Background(), o)
	assert.Equal(t, CodeOf(err), CodeSourceUnreachable, "%v", err)
	assert.Check(t, is.Contains(err.Error(), "connection refused"))
	assert.Check(t, is.Contains(err.Error(), "GET "+url+"/index.json failed"))
}

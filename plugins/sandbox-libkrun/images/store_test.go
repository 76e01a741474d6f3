package images

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	extract "github.com/iii-sandbox/iii/internal/tarextract"
	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/registrytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The HTTP client's idle keep-alive connections to the test
		// registries close on their own schedule.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// noKeychain keeps the host's Docker credentials out of the tests.
type noKeychain struct{}

func (noKeychain) Resolve(authn.Resource) (authn.Authenticator, error) { return authn.Anonymous, nil }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func smallImage(t testing.TB) v1.Image {
	return testImage(t, "", v1.Config{Env: []string{"PATH=/bin", "A=1"}, WorkingDir: "/work", User: "1000:1000", Cmd: []string{"/bin/sh"}},
		gzLayer(t, td("bin"), tf("bin/hello", "#!/bin/sh\necho hi\n"), tf("etc/os-release", "ID=test\n")),
		gzLayer(t, tf("etc/motd", "layer two\n"), tf("etc/.wh.os-release", "")),
	)
}

func TestEnsurePullsThroughRegistry(t *testing.T) {
	e := newEnv(t)
	reg := startRegistry(t, registrytest.Options{})
	ref, err := reg.Push(ctx(t), "team/small:1", smallImage(t))
	assert.NilError(t, err)
	s := e.store(t, nil)

	var log progressLog
	img, err := s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true, Progress: log.add})
	assert.NilError(t, err)
	assert.DeepEqual(t, log.phases(), []Phase{PhaseResolving, PhasePulling, PhaseUnpacking, PhaseBuilding})
	assert.Equal(t, img.Ref, ref)
	assert.Equal(t, img.Config.Source, "registry")
	assert.DeepEqual(t, img.Config.Env, []string{"PATH=/bin", "A=1"})
	assert.Equal(t, img.Config.WorkingDir, "/work")
	assert.Equal(t, img.Config.User, "1000:1000")
	assert.Equal(t, img.Config.Platform, "linux/"+runtime.GOARCH)
	assert.Equal(t, img.Dir, filepath.Join(e.root, "images", "sha256", strings.TrimPrefix(img.Digest, "sha256:")))
	assert.Equal(t, len(img.Config.Layers), 2)

	// image.json on disk is what Ensure returned.
	b, err := os.ReadFile(img.ConfigPath)
	assert.NilError(t, err)
	var onDisk ImageConfig
	assert.NilError(t, json.Unmarshal(b, &onDisk))
	assert.DeepEqual(t, onDisk, img.Config)

	tree := unpackErofs(t, img.RootfsPath)
	assert.DeepEqual(t, listTree(t, tree), []string{"bin", "bin/hello", "etc", "etc/motd"})
	got, err := os.ReadFile(filepath.Join(tree, "etc/motd"))
	assert.NilError(t, err)
	assert.Equal(t, string(got), "layer two\n")

	// Cached: neither Ensure nor Lookup asks the registry again.
	reg.ResetRequests()
	again, err := s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: false})
	assert.NilError(t, err)
	assert.Equal(t, again.Digest, img.Digest)
	looked, err := s.Lookup(ref)
	assert.NilError(t, err)
	assert.Equal(t, looked.RootfsPath, img.RootfsPath)
	byDigest, err := s.Lookup(reg.Ref("team/small@" + img.Digest))
	assert.NilError(t, err)
	assert.Equal(t, byDigest.Digest, img.Digest)
	assert.Equal(t, reg.Requests("manifest GET")+reg.Requests("blob GET"), 0)

	// Refresh asks again and finds the same digest: only the manifest and
	// the config are fetched, no layer, nothing is rebuilt.
	_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true, Refresh: true})
	assert.NilError(t, err)
	assert.Equal(t, reg.Requests("blob GET"), 1)

	entries, err := os.ReadDir(filepath.Join(e.root, "images", "blobs", "sha256"))
	assert.NilError(t, err)
	assert.Equal(t, len(entries), 0, "downloaded layers are dropped once the image is built")
	assertConsistent(t, e.root)
	e.assertUntouched(t)
}

func TestEnsureConcurrentPullsOnce(t *testing.T) {
	e := newEnv(t)
	reg := startRegistry(t, registrytest.Options{})
	ref, err := reg.Push(ctx(t), "team/small:1", smallImage(t))
	assert.NilError(t, err)
	reg.ResetRequests()
	s := e.store(t, nil)

	const n = 8
	var wg sync.WaitGroup
	digests := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
			errs[i] = err
			if err == nil {
				digests[i] = img.Digest
			}
		}()
	}
	waitfor.Group(t, &wg, 2*time.Minute, "the concurrent Ensure calls")
	for i := range n {
		assert.NilError(t, errs[i])
		assert.Equal(t, digests[i], digests[0])
	}
	// Two layers plus the config blob, each fetched once.
	assert.Equal(t, reg.Requests("blob GET"), 3)
	assert.Equal(t, installedCount(t, e.root), 1)
	assertConsistent(t, e.root)
}

func TestEnsureAuth(t *testing.T) {
	tests := []struct {
		name  string
		auth  registrytest.Auth
		creds *Credential
		ok    bool
	}{
		{name: "basic with credentials", auth: registrytest.AuthBasic, creds: &Credential{Username: "u", Password: "p"}, ok: true},
		{name: "token flow with credentials", auth: registrytest.AuthToken, creds: &Credential{Username: "u", Password: "p"}, ok: true},
		{name: "basic without credentials", auth: registrytest.AuthBasic},
		{name: "token flow with wrong password", auth: registrytest.AuthToken, creds: &Credential{Username: "u", Password: "wrong"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			reg := startRegistry(t, registrytest.Options{Auth: tc.auth, Username: "u", Password: "p"})
			ref, err := reg.Push(ctx(t), "private/img:1", smallImage(t))
			assert.NilError(t, err)
			s := e.store(t, func(o *Options) {
				if tc.creds != nil {
					o.Credentials = map[string]Credential{reg.Host(): *tc.creds}
				}
			})
			_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
			if tc.ok {
				assert.NilError(t, err)
				if tc.auth == registrytest.AuthToken {
					assert.Assert(t, reg.Requests("token GET") > 0)
				}
			} else {
				var ie *InstallError
				assert.Assert(t, errors.As(err, &ie), "got %v", err)
				assert.Assert(t, ie.Retryable())
				assert.Equal(t, ie.Code(), "S102")
				assert.ErrorContains(t, err, "UNAUTHORIZED")
			}
			assertConsistent(t, e.root)
		})
	}
}

func TestEnsureKeychain(t *testing.T) {
	e := newEnv(t)
	reg := startRegistry(t, registrytest.Options{Auth: registrytest.AuthToken, Username: "u", Password: "p"})
	ref, err := reg.Push(ctx(t), "private/img:1", smallImage(t))
	assert.NilError(t, err)
	s := e.store(t, func(o *Options) { o.Keychain = staticKeychain{host: reg.Host(), auth: reg.Authenticator()} })
	_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
	assert.NilError(t, err)
}

type staticKeychain struct {
	host string
	auth authn.Authenticator
}

func (k staticKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if r.RegistryStr() == k.host {
		return k.auth, nil
	}
	return authn.Anonymous, nil
}

func TestEnsureMirror(t *testing.T) {
	e := newEnv(t)
	reg := startRegistry(t, registrytest.Options{})
	_, err := reg.Push(ctx(t), "iiidev/tiny:latest", smallImage(t))
	assert.NilError(t, err)
	s := e.store(t, func(o *Options) { o.Mirrors = map[string]string{"docker.io": reg.URL()} })
	for _, ref := range []string{"docker.io/iiidev/tiny:latest", "index.docker.io/iiidev/tiny", "iiidev/tiny"} {
		img, err := s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
		assert.NilError(t, err, ref)
		assert.Equal(t, img.Ref, "docker.io/iiidev/tiny:latest")
	}
	assert.Equal(t, installedCount(t, e.root), 1)
}

func TestMirrorValidation(t *testing.T) {
	tests := []struct {
		mirrors  map[string]string
		insecure bool
		wantErr  string
	}{
		{mirrors: map[string]string{"docker.io": "http://127.0.0.1:5000"}},
		{mirrors: map[string]string{"docker.io": "https://mirror.internal"}},
		{mirrors: map[string]string{"docker.io": "http://mirror.internal:5000"}, insecure: true},
		{mirrors: map[string]string{"docker.io": "http://mirror.internal:5000"}, wantErr: "needs insecure: true"},
		{mirrors: map[string]string{"docker.io": "ftp://x"}, wantErr: "not an http(s) base URL"},
		{mirrors: map[string]string{"docker.io": "https://x/prefix"}, wantErr: "scheme://host[:port] only"},
		{mirrors: map[string]string{"docker.io": "127.0.0.1:5000"}, wantErr: "not an http(s) base URL"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.mirrors, tc.insecure), func(t *testing.T) {
			_, err := Open(Options{Root: t.TempDir(), Mirrors: tc.mirrors, Insecure: tc.insecure})
			if tc.wantErr == "" {
				assert.NilError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.wantErr)
			}
		})
	}
}

func TestEnsurePicksPlatform(t *testing.T) {
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	e := newEnv(t)
	reg := startRegistry(t, registrytest.Options{})
	mine := testImage(t, "", v1.Config{}, gzLayer(t, tf("arch", runtime.GOARCH)))
	theirs := testImage(t, other, v1.Config{}, gzLayer(t, tf("arch", other)))
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: theirs, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: other}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	ref, err := reg.PushIndex(ctx(t), "multi/img:1", idx)
	assert.NilError(t, err)
	onlyOther := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: theirs, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: other}}})
	refOther, err := reg.PushIndex(ctx(t), "multi/other:1", onlyOther)
	assert.NilError(t, err)
	refSingle, err := reg.Push(ctx(t), "multi/single-other:1", theirs)
	assert.NilError(t, err)

	s := e.store(t, nil)
	img, err := s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
	assert.NilError(t, err)
	wantDigest, err := mine.Digest()
	assert.NilError(t, err)
	assert.Equal(t, img.Digest, wantDigest.String())
	got, err := os.ReadFile(filepath.Join(unpackErofs(t, img.RootfsPath), "arch"))
	assert.NilError(t, err)
	assert.Equal(t, string(got), runtime.GOARCH)

	_, err = s.Ensure(ctx(t), refOther, EnsureOptions{AutoInstall: true})
	assert.ErrorContains(t, err, "no manifest for the wanted platform linux/"+runtime.GOARCH)
	_, err = s.Ensure(ctx(t), refSingle, EnsureOptions{AutoInstall: true})
	assert.ErrorContains(t, err, "image is for linux/"+other)
	assertConsistent(t, e.root)
}

func TestEnsureNotInstalled(t *testing.T) {
	e := newEnv(t)
	reg := startRegistry(t, registrytest.Options{})
	ref, err := reg.Push(ctx(t), "team/small:1", smallImage(t))
	assert.NilError(t, err)
	reg.ResetRequests()
	s := e.store(t, nil)

	_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: false})
	assert.Assert(t, errors.Is(err, ErrNotInstalled), "got %v", err)
	var ni *NotInstalledError
	assert.Assert(t, errors.As(err, &ni))
	assert.Equal(t, ni.Code(), "S101")
	assert.ErrorContains(t, err, "auto_install is false")
	assert.Equal(t, reg.Requests("manifest GET")+reg.Requests("manifest HEAD"), 0, "auto_install=false must not reach the registry")

	_, err = s.Lookup(ref)
	assert.Assert(t, errors.Is(err, ErrNotInstalled))
	assert.Equal(t, installedCount(t, e.root), 0)
}

func TestEnsureLocalLayout(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, nil)
	layoutDir := filepath.Join(e.root, "oci") // the default local layout
	ref := "docker.io/iiidev/tiny:latest"

	first := testImage(t, "", v1.Config{Env: []string{"V=1"}}, gzLayer(t, tf("v", "1")))
	d1, err := ocilayout.Put(layoutDir, ref, first)
	assert.NilError(t, err)
	// Loaded images need no network: auto_install=false still installs them.
	img, err := s.Ensure(ctx(t), "iiidev/tiny", EnsureOptions{AutoInstall: false})
	assert.NilError(t, err)
	assert.Equal(t, img.Digest, d1.String())
	assert.Equal(t, img.Config.Source, "local")

	// Rebuilding the local image replaces what Ensure returns.
	second := testImage(t, "", v1.Config{Env: []string{"V=2"}}, gzLayer(t, tf("v", "2")))
	d2, err := ocilayout.Put(layoutDir, ref, second)
	assert.NilError(t, err)
	img, err = s.Ensure(ctx(t), ref, EnsureOptions{})
	assert.NilError(t, err)
	assert.Equal(t, img.Digest, d2.String())
	assert.DeepEqual(t, img.Config.Env, []string{"V=2"})
	got, err := s.Lookup(ref)
	assert.NilError(t, err)
	assert.Equal(t, got.Digest, d2.String())

	// The layout dropped the first image's blobs.
	_, err = os.Stat(ocilayout.BlobPath(layoutDir, d1))
	assert.Assert(t, errors.Is(err, fs.ErrNotExist))
	assertConsistent(t, e.root)
}

func TestEnsureRegistryFailure(t *testing.T) {
	isBlob := func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:")
	}
	tests := []struct {
		name    string
		match   func(*http.Request) bool
		respond func(http.ResponseWriter, *http.Request)
		wantErr string
	}{
		{
			name:    "blob fetch fails",
			match:   isBlob,
			respond: func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", http.StatusInternalServerError) },
			wantErr: "500",
		},
		{
			name:  "blob content corrupted",
			match: isBlob,
			respond: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/octet-stream")
				_, _ = w.Write([]byte("definitely not the blob"))
			},
			wantErr: "sha256",
		},
		{
			name:  "manifest missing",
			match: func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/manifests/") },
			respond: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
			},
			wantErr: "MANIFEST_UNKNOWN",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			hook := &failingHook{match: tc.match, respond: tc.respond}
			reg := startRegistry(t, registrytest.Options{Hook: hook.hook})
			ref, err := reg.Push(ctx(t), "team/small:1", smallImage(t))
			assert.NilError(t, err)
			s := e.store(t, nil)

			hook.set(true)
			_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
			var ie *InstallError
			assert.Assert(t, errors.As(err, &ie), "got %v", err)
			assert.Assert(t, ie.Retryable())
			assert.ErrorContains(t, err, tc.wantErr)
			assertConsistent(t, e.root)
			assert.Equal(t, installedCount(t, e.root), 0)
			_, err = s.Lookup(ref)
			assert.Assert(t, errors.Is(err, ErrNotInstalled))

			// The failure was transient: a retry succeeds.
			hook.set(false)
			_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
			assert.NilError(t, err)
			assertConsistent(t, e.root)
		})
	}

	t.Run("registry down", func(t *testing.T) {
		e := newEnv(t)
		reg, err := registrytest.Start(registrytest.Options{})
		assert.NilError(t, err)
		ref := reg.Ref("team/small:1")
		reg.Close()
		s := e.store(t, nil)
		_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
		var ie *InstallError
		assert.Assert(t, errors.As(err, &ie), "got %v", err)
		assert.Equal(t, ie.Phase, PhaseResolving)
		assertConsistent(t, e.root)
	})
}

func TestEnsureCancelled(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	reg := startRegistry(t, registrytest.Options{Hook: func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") && !strings.Contains(r.URL.Path, "uploads") {
			select {
			case entered <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return true
		}
		return false
	}})
	// Push before the hook matters: uploads are not GETs of blobs.
	ref, err := reg.Push(ctx(t), "team/small:1", smallImage(t))
	assert.NilError(t, err)
	s := e.store(t, nil)

	c, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Ensure(c, ref, EnsureOptions{AutoInstall: true})
		errc <- err
	}()
	waitfor.Recv(t, entered, waitfor.Default, "the blob download to start")
	cancel()
	err = waitfor.Recv(t, errc, waitfor.Default, "the cancelled Ensure to return")
	assert.Assert(t, errors.Is(err, context.Canceled), "got %v", err)
	close(release)
	waitfor.Func(t, waitfor.Default, "the store to close", func() { err = s.Close() }) // waits for the cancelled install to unwind
	assert.NilError(t, err)
	assertConsistent(t, e.root)
	assert.Equal(t, installedCount(t, e.root), 0)
}

// hostile builds a layer with paths aimed at the sentinel dir.
func TestEnsureHostileImages(t *testing.T) {
	type check func(t *testing.T, e *env, img *Image, tree string)
	tests := []struct {
		name    string
		layers  func(e *env) []v1.Layer
		limits  extract.Limits
		wantErr string // "" = installed, neutralised
		check   check
	}{
		{
			name:    "dot-dot path",
			layers:  func(e *env) []v1.Layer { return []v1.Layer{gzLayer(t, tf("../../sentinel/secret", "pwned"))} },
			wantErr: extract.CodePathEscape,
		},
		{
			name: "absolute paths stay inside",
			layers: func(e *env) []v1.Layer {
				return []v1.Layer{gzLayer(t, tf(filepath.Join(e.sentinel, "secret"), "inside"))}
			},
			check: func(t *testing.T, e *env, img *Image, tree string) {
				got, err := os.ReadFile(filepath.Join(tree, e.sentinel, "secret"))
				assert.NilError(t, err)
				assert.Equal(t, string(got), "inside")
			},
		},
		{
			name: "absolute and relative symlink escapes, written through by a later layer",
			layers: func(e *env) []v1.Layer {
				return []v1.Layer{
					gzLayer(t, tsym("abs", e.sentinel), tsym("rel", "../../../../../../../"+strings.TrimPrefix(e.sentinel, "/"))),
					gzLayer(t, tf("abs/secret", "via abs"), tf("rel/etc/passwd", "via rel"), tf("abs/.wh.secret2", "")),
				}
			},
			check: func(t *testing.T, e *env, img *Image, tree string) {
				got, err := os.ReadFile(filepath.Join(tree, e.sentinel, "secret"))
				assert.NilError(t, err)
				assert.Equal(t, string(got), "via abs")
				got, err = os.ReadFile(filepath.Join(tree, e.sentinel, "etc/passwd"))
				assert.NilError(t, err)
				assert.Equal(t, string(got), "via rel")
			},
		},
		{
			name:    "hard link out of the root",
			layers:  func(e *env) []v1.Layer { return []v1.Layer{gzLayer(t, thard("stolen", "../../sentinel/secret"))} },
			wantErr: extract.CodePathEscape,
		},
		{
			name: "hard link through a symlink to the host",
			layers: func(e *env) []v1.Layer {
				return []v1.Layer{gzLayer(t, tsym("host", e.sentinel)), gzLayer(t, thard("stolen", "host/secret"))}
			},
			wantErr: extract.CodeBadEntry,
		},
		{
			name: "setuid binaries and device nodes",
			layers: func(e *env) []v1.Layer {
				return []v1.Layer{gzLayer(t, tmode(tf("bin/su", "x"), 0o4755), tmode(tf("bin/wall", "x"), 0o2755),
					tdev("dev/mem", tar.TypeChar), tdev("dev/sda", tar.TypeBlock), tdev("pipe", tar.TypeFifo))}
			},
			check: func(t *testing.T, e *env, img *Image, tree string) {
				assert.Equal(t, img.Config.Unpacked.StrippedSetID, 2)
				assert.Equal(t, img.Config.Unpacked.SkippedDevices, 3)
				for _, p := range []string{"bin/su", "bin/wall"} {
					fi, err := os.Stat(filepath.Join(tree, p))
					assert.NilError(t, err)
					assert.Equal(t, fi.Mode(), fs.FileMode(0o755), p)
				}
				for _, p := range []string{"dev/mem", "dev/sda", "pipe"} {
					_, err := os.Lstat(filepath.Join(tree, p))
					assert.Assert(t, errors.Is(err, fs.ErrNotExist), p)
				}
			},
		},
		{
			name:   "tar bomb of many entries",
			limits: extract.Limits{MaxEntries: 500},
			layers: func(e *env) []v1.Layer {
				var ents []tarEnt
				for i := range 5000 {
					ents = append(ents, tf(fmt.Sprintf("d%d/f%d", i%10, i), ""))
				}
				return []v1.Layer{gzLayer(t, ents...)}
			},
			wantErr: extract.CodeLimit,
		},
		{
			name:   "decompression bomb",
			limits: extract.Limits{MaxTotalBytes: 1 << 20},
			layers: func(e *env) []v1.Layer {
				return []v1.Layer{gzLayer(t, tf("zeros", strings.Repeat("\x00", 8<<20)))}
			},
			wantErr: extract.CodeLimit,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			reg := startRegistry(t, registrytest.Options{})
			ref, err := reg.Push(ctx(t), "evil/img:1", testImage(t, "", v1.Config{}, tc.layers(e)...))
			assert.NilError(t, err)
			s := e.store(t, func(o *Options) { o.Limits = tc.limits })
			img, err := s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
			e.assertUntouched(t)
			assertConsistent(t, e.root)
			if tc.wantErr != "" {
				var ie *InstallError
				assert.Assert(t, errors.As(err, &ie), "got %v", err)
				assert.Equal(t, ie.Phase, PhaseUnpacking)
				assert.ErrorContains(t, err, tc.wantErr)
				assert.Equal(t, installedCount(t, e.root), 0)
				return
			}
			assert.NilError(t, err)
			if tc.check != nil {
				tc.check(t, e, img, unpackErofs(t, img.RootfsPath))
			}
			e.assertUntouched(t)
		})
	}
}

// TestEnsureRefusesOversizedLayerBeforeDownload serves a manifest whose
// layer claims 10 GiB: the store must refuse it from the descriptor alone.
func TestEnsureRefusesOversizedLayerBeforeDownload(t *testing.T) {
	e := newEnv(t)
	reg := startRegistry(t, registrytest.Options{})
	img := smallImage(t)
	ref, err := reg.Push(ctx(t), "evil/big:1", img)
	assert.NilError(t, err)
	m, err := img.Manifest()
	assert.NilError(t, err)
	m = m.DeepCopy()
	m.Layers[1].Size = 10 << 30
	raw, err := json.Marshal(m)
	assert.NilError(t, err)
	r, err := name.ParseReference(ref)
	assert.NilError(t, err)
	assert.NilError(t, remote.Put(r, rawManifest{raw: raw, mt: types.OCIManifestSchema1}, remote.WithContext(ctx(t))))
	reg.ResetRequests()

	s := e.store(t, nil)
	_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
	var ie *InstallError
	assert.Assert(t, errors.As(err, &ie), "got %v", err)
	assert.ErrorContains(t, err, "claims 10737418240 bytes")
	assert.Equal(t, reg.Requests("blob GET"), 0, "nothing may be downloaded")
	assertConsistent(t, e.root)

	// A manifest that understates a layer's size is caught while pulling.
	m.Layers[1].Size = 10
	raw, err = json.Marshal(m)
	assert.NilError(t, err)
	assert.NilError(t, remote.Put(r, rawManifest{raw: raw, mt: types.OCIManifestSchema1}, remote.WithContext(ctx(t))))
	_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
	assert.Assert(t, errors.As(err, &ie), "got %v", err)
	assert.Check(t, is.Equal(ie.Phase, PhasePulling))
	assertConsistent(t, e.root)
	e.assertUntouched(t)
}

type rawManifest struct {
	raw []byte
	mt  types.MediaType
}

func (r rawManifest) RawManifest() ([]byte, error)        { return r.raw, nil }
func (r rawManifest) MediaType() (types.MediaType, error) { return r.mt, nil }

// TestEnsureResumesAfterFailure: layers verified before a failure are not
// downloaded again by the retry, and stale leftovers are swept later.
func TestEnsureResumesAfterFailure(t *testing.T) {
	e := newEnv(t)
	img := smallImage(t)
	layers, err := img.Layers()
	assert.NilError(t, err)
	second, err := layers[1].Digest()
	assert.NilError(t, err)
	first, err := layers[0].Digest()
	assert.NilError(t, err)
	hook := &failingHook{
		match: func(r *http.Request) bool {
			return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, second.String())
		},
		respond: func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", http.StatusServiceUnavailable) },
	}
	reg := startRegistry(t, registrytest.Options{Hook: hook.hook})
	ref, err := reg.Push(ctx(t), "team/small:1", img)
	assert.NilError(t, err)
	s := e.store(t, nil)

	hook.set(true)
	_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
	var ie *InstallError
	assert.Assert(t, errors.As(err, &ie), "got %v", err)
	assert.Equal(t, ie.Phase, PhasePulling)
	kept := filepath.Join(e.root, "images", "blobs", "sha256", first.Hex)
	_, err = os.Stat(kept)
	assert.NilError(t, err, "the verified first layer is kept for the retry")
	assertConsistent(t, e.root)

	hook.set(false)
	reg.ResetRequests()
	_, err = s.Ensure(ctx(t), ref, EnsureOptions{AutoInstall: true})
	assert.NilError(t, err)
	// The config and the second layer only.
	assert.Equal(t, reg.Requests("blob GET"), 2)
	_, err = os.Stat(kept)
	assert.Assert(t, errors.Is(err, fs.ErrNotExist), "layers are dropped once built")

	// A leftover from an abandoned pull goes after a day.
	stale := filepath.Join(e.root, "images", "blobs", "sha256", second.Hex)
	assert.NilError(t, os.WriteFile(stale, []byte("x"), 0o644))
	scratch := filepath.Join(e.root, "images", "tmp", "dead-install")
	assert.NilError(t, os.MkdirAll(filepath.Join(scratch, "rootfs", "ro"), 0o755))
	assert.NilError(t, os.Chmod(filepath.Join(scratch, "rootfs"), 0o555))
	e.store(t, nil)
	_, err = os.Stat(stale)
	assert.NilError(t, err, "fresh leftovers stay")
	later := func(o *Options) { o.Now = func() time.Time { return time.Now().Add(25 * time.Hour) } }
	e.store(t, later)
	_, err = os.Stat(stale)
	assert.Assert(t, errors.Is(err, fs.ErrNotExist))
	_, err = os.Stat(scratch)
	assert.Assert(t, errors.Is(err, fs.ErrNotExist))
	assertConsistent(t, e.root)
}

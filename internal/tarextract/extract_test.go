package tarextract

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// ent describes one tar entry of a test layer.
type ent struct {
	name     string
	typ      byte
	body     string
	link     string
	mode     int64
	size     int64 // claimed size when body is empty; 0 = len(body)
	uid, gid int
}

func file(name, body string) ent      { return ent{name: name, typ: tar.TypeReg, body: body, mode: 0o644} }
func dir(name string, mode int64) ent { return ent{name: name, typ: tar.TypeDir, mode: mode} }
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func hardlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeLink, link: target, mode: 0o644}
}
func special(name string, typ byte) ent { return ent{name: name, typ: typ, mode: 0o644} }
func claim(name string, size int64) ent {
	return ent{name: name, typ: tar.TypeReg, size: size, mode: 0o644}
}
func withMode(e ent, mode int64) ent         { e.mode = mode; return e }
func layerOf(t testing.TB, es ...ent) []byte { return tarBytes(t, es...) }

func tarBytes(t testing.TB, es ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		size := int64(len(e.body))
		if e.size > 0 {
			size = e.size
		}
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Size: size, Uid: e.uid, Gid: e.gid, Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		assert.NilError(t, tw.WriteHeader(hdr))
		if e.size > 0 {
			// A header that claims more than follows: stop here, the
			// extractor must refuse it before reading the body.
			return buf.Bytes()
		}
		if e.body != "" {
			_, err := tw.Write([]byte(e.body))
			assert.NilError(t, err)
		}
	}
	assert.NilError(t, tw.Close())
	return buf.Bytes()
}

// sandbox is a temp dir with the extraction root and a sentinel dir beside
// it; nothing an image does may change the sentinel.
type sandbox struct {
	base, root, sentinel string
	before               map[string]string
}

func newSandbox(t testing.TB) *sandbox {
	t.Helper()
	base := t.TempDir()
	s := &sandbox{base: base, root: filepath.Join(base, "root"), sentinel: filepath.Join(base, "sentinel")}
	assert.NilError(t, os.Mkdir(s.root, 0o755))
	assert.NilError(t, os.MkdirAll(filepath.Join(s.sentinel, "etc"), 0o755))
	assert.NilError(t, os.WriteFile(filepath.Join(s.sentinel, "secret"), []byte("keep"), 0o644))
	assert.NilError(t, os.WriteFile(filepath.Join(s.sentinel, "etc", "passwd"), []byte("root:x:0:0"), 0o644))
	s.before = snapshot(t, base, "root")
	return s
}

// snapshot records every path under dir except the skipped top-level name.
func snapshot(t testing.TB, dir, skip string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == skip {
			return filepath.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += ":" + string(b)
		}
		out[rel] = v
		return nil
	})
	assert.NilError(t, err)
	return out
}

func (s *sandbox) assertUntouched(t testing.TB) {
	t.Helper()
	assert.DeepEqual(t, snapshot(t, s.base, "root"), s.before)
}

func (s *sandbox) extract(t testing.TB, opts Options, layers ...[]byte) (Stats, error) {
	t.Helper()
	x, err := New(s.root, opts)
	assert.NilError(t, err)
	defer x.Close()
	for _, l := range layers {
		if err := x.Layer(context.Background(), bytes.NewReader(l)); err != nil {
			return x.Stats(), err
		}
	}
	return x.Stats(), x.Finish()
}

func (s *sandbox) read(t testing.TB, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.root, rel))
	assert.NilError(t, err)
	return string(b)
}

func (s *sandbox) missing(t testing.TB, rel string) {
	t.Helper()
	_, err := os.Lstat(filepath.Join(s.root, rel))
	assert.Assert(t, errors.Is(err, fs.ErrNotExist), "%s exists: %v", rel, err)
}

func TestExtractHostile(t *testing.T) {
	type check func(t *testing.T, s *sandbox, st Stats)
	tests := []struct {
		name     string
		layers   func(s *sandbox) [][]byte
		opts     Options
		wantCode string // "" = extraction succeeds
		check    check
	}{
		{
			name:     "dot-dot path is refused",
			layers:   func(s *sandbox) [][]byte { return [][]byte{layerOf(t, file("../sentinel/secret", "pwned"))} },
			wantCode: CodePathEscape,
		},
		{
			name:     "dot-dot in the middle is refused",
			layers:   func(s *sandbox) [][]byte { return [][]byte{layerOf(t, file("a/../../sentinel/x", "pwned"))} },
			wantCode: CodePathEscape,
		},
		{
			name: "absolute path lands inside the root",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, file(filepath.Join(s.sentinel, "secret"), "inside"), file("/etc/passwd", "img"))}
			},
			check: func(t *testing.T, s *sandbox, st Stats) {
				assert.Equal(t, s.read(t, filepath.Join(s.sentinel, "secret")), "inside")
				assert.Equal(t, s.read(t, "etc/passwd"), "img")
			},
		},
		{
			name: "absolute symlink is followed inside the root",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, symlink("host", s.sentinel), file("host/secret", "inside"))}
			},
			check: func(t *testing.T, s *sandbox, st Stats) {
				assert.Equal(t, s.read(t, strings.TrimPrefix(s.sentinel, "/")+"/secret"), "inside")
			},
		},
		{
			name: "relative symlink escape is clamped at the root",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, symlink("up", "../../../../../../sentinel"), file("up/secret", "inside"))}
			},
			check: func(t *testing.T, s *sandbox, st Stats) {
				assert.Equal(t, s.read(t, "sentinel/secret"), "inside")
			},
		},
		{
			name: "a later layer writing through an earlier symlink stays inside",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{
					layerOf(t, symlink("etc", "../sentinel/etc"), symlink("abs", s.sentinel)),
					layerOf(t, file("etc/passwd", "layer2"), file("abs/secret", "layer2"), dir("abs/newdir", 0o755)),
				}
			},
			check: func(t *testing.T, s *sandbox, st Stats) {
				assert.Equal(t, s.read(t, "sentinel/etc/passwd"), "layer2")
				assert.Equal(t, s.read(t, strings.TrimPrefix(s.sentinel, "/")+"/secret"), "layer2")
			},
		},
		{
			name: "replacing a symlink with a file does not write through it",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{
					layerOf(t, symlink("f", filepath.Join(s.sentinel, "secret"))),
					layerOf(t, file("f", "replaced")),
				}
			},
			check: func(t *testing.T, s *sandbox, st Stats) {
				fi, err := os.Lstat(filepath.Join(s.root, "f"))
				assert.NilError(t, err)
				assert.Assert(t, fi.Mode().IsRegular())
				assert.Equal(t, s.read(t, "f"), "replaced")
			},
		},
		{
			name:     "hard link out of the root is refused",
			layers:   func(s *sandbox) [][]byte { return [][]byte{layerOf(t, hardlink("h", "../sentinel/secret"))} },
			wantCode: CodePathEscape,
		},
		{
			name: "hard link to an absolute host path resolves inside the root",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, hardlink("h", filepath.Join(s.sentinel, "secret")))}
			},
			wantCode: CodeBadEntry, // no such file inside the root
		},
		{
			name: "hard link through a symlink resolves inside the root",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, symlink("s", s.sentinel), hardlink("h", "s/secret"))}
			},
			wantCode: CodeBadEntry,
		},
		{
			name: "hard link inside the root works",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, file("bin/a", "same"), hardlink("bin/b", "bin/a"), hardlink("/bin/c", "/bin/a"))}
			},
			check: func(t *testing.T, s *sandbox, st Stats) {
				a, err := os.Stat(filepath.Join(s.root, "bin/a"))
				assert.NilError(t, err)
				b, err := os.Stat(filepath.Join(s.root, "bin/b"))
				assert.NilError(t, err)
				assert.Assert(t, os.SameFile(a, b))
				assert.Equal(t, s.read(t, "bin/c"), "same")
				assert.Equal(t, st.Hardlinks, 2)
			},
		},
		{
			name: "hard link to a directory is refused",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, dir("d", 0o755), hardlink("h", "d"))}
			},
			wantCode: CodeBadEntry,
		},
		{
			name: "setuid and setgid bits are stripped, sticky kept",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, withMode(file("bin/su", "x"), 0o4755), withMode(file("bin/sg", "x"), 0o2711), dir("tmp", 0o1777), dir("sgdir", 0o2775))}
			},
			check: func(t *testing.T, s *sandbox, st Stats) {
				for p, want := range map[string]fs.FileMode{"bin/su": 0o755, "bin/sg": 0o711, "tmp": fs.ModeDir | fs.ModeSticky | 0o777, "sgdir": fs.ModeDir | 0o775} {
					fi, err := os.Lstat(filepath.Join(s.root, p))
					assert.NilError(t, err)
					assert.Equal(t, fi.Mode(), want, p)
				}
				assert.Equal(t, st.StrippedSetID, 3)
			},
		},
		{
			name: "device nodes and fifos are skipped and counted",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, special("dev/null", tar.TypeChar), special("dev/sda", tar.TypeBlock), special("run/fifo", tar.TypeFifo), file("ok", "1"))}
			},
			check: func(t *testing.T, s *sandbox, st Stats) {
				s.missing(t, "dev/null")
				s.missing(t, "dev/sda")
				s.missing(t, "run/fifo")
				assert.Equal(t, st.SkippedDevices, 3)
				assert.Equal(t, s.read(t, "ok"), "1")
			},
		},
		{
			name:     "a file claiming 10 GiB is refused before its body is read",
			layers:   func(s *sandbox) [][]byte { return [][]byte{layerOf(t, claim("big", 10<<30))} },
			wantCode: CodeLimit,
		},
		{
			name: "total size cap",
			opts: Options{Limits: Limits{MaxTotalBytes: 10}},
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, file("a", "123456")), layerOf(t, file("b", "123456"))}
			},
			wantCode: CodeLimit,
		},
		{
			name: "tar bomb of many entries",
			opts: Options{Limits: Limits{MaxEntries: 100}},
			layers: func(s *sandbox) [][]byte {
				var es []ent
				for i := range 1000 {
					es = append(es, dir(strings.Repeat("d", 1+i%50)+"/"+string(rune('a'+i%26)), 0o755))
				}
				return [][]byte{layerOf(t, es...)}
			},
			wantCode: CodeLimit,
		},
		{
			name: "symlink loop is an error, not a hang",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, symlink("a", "b"), symlink("b", "a"), file("a/x", "1"))}
			},
			wantCode: CodeBadEntry,
		},
		{
			name: "whiteout through an escaping symlink stays inside",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, symlink("up", "../sentinel")), layerOf(t, file("up/.wh.secret", ""), file("up/.wh..wh..opq", ""))}
			},
		},
		{
			name: "whiteout of an absolute host path stays inside",
			layers: func(s *sandbox) [][]byte {
				return [][]byte{layerOf(t, file(filepath.Join(s.sentinel, ".wh.secret"), ""), file(filepath.Join(s.sentinel, ".wh..wh..opq"), ""))}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t)
			st, err := s.extract(t, tc.opts, tc.layers(s)...)
			s.assertUntouched(t)
			if tc.wantCode != "" {
				var xe *Error
				assert.Assert(t, errors.As(err, &xe), "got %v", err)
				assert.Equal(t, xe.Code, tc.wantCode, xe.Error())
				return
			}
			assert.NilError(t, err)
			if tc.check != nil {
				tc.check(t, s, st)
			}
		})
	}
}

func TestExtractWhiteouts(t *testing.T) {
	s := newSandbox(t)
	_, err := s.extract(t, Options{},
		layerOf(t, file("a/x", "1"), file("a/y", "1"), file("b/z", "1"), file("b/sub/deep", "1"), file("c/keep", "1"), file("d/old", "1")),
		layerOf(t,
			file("a/.wh.x", ""),
			file("b/.wh..wh..opq", ""),
			file("b/new", "2"),
			file("b/sub/fresh", "2"),
			// Same-layer content survives an opaque marker that follows it.
			file("c/mine", "2"),
			file("c/.wh..wh..opq", ""),
			// A whiteout does not hide what its own layer wrote.
			file("d/new", "2"),
			file("d/.wh.new", ""),
			file("d/.wh.old", ""),
			file(".wh..wh.plnk", ""),
		),
	)
	assert.NilError(t, err)
	s.missing(t, "a/x")
	assert.Equal(t, s.read(t, "a/y"), "1")
	s.missing(t, "b/z")
	s.missing(t, "b/sub/deep")
	assert.Equal(t, s.read(t, "b/new"), "2")
	assert.Equal(t, s.read(t, "b/sub/fresh"), "2")
	s.missing(t, "c/keep")
	assert.Equal(t, s.read(t, "c/mine"), "2")
	assert.Equal(t, s.read(t, "d/new"), "2")
	s.missing(t, "d/old")
	s.missing(t, ".wh..wh.plnk")
	s.missing(t, "a/.wh.x")
	s.assertUntouched(t)
}

func TestExtractReplaceAndModes(t *testing.T) {
	s := newSandbox(t)
	_, err := s.extract(t, Options{},
		layerOf(t, dir("ro", 0o555), file("ro/f", "1"), dir("x", 0o755), file("x/inner", "1"), file("y", "file")),
		layerOf(t, file("ro/g", "2"), file("x", "now a file"), dir("y", 0o750), file("y/in", "3"), dir("/", 0o755)),
	)
	assert.NilError(t, err)
	fi, err := os.Stat(filepath.Join(s.root, "ro"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), fs.FileMode(0o555))
	assert.Equal(t, s.read(t, "ro/g"), "2")
	assert.Equal(t, s.read(t, "x"), "now a file")
	assert.Equal(t, s.read(t, "y/in"), "3")
	fi, err = os.Stat(filepath.Join(s.root, "y"))
	assert.NilError(t, err)
	assert.Equal(t, fi.Mode().Perm(), fs.FileMode(0o750))
	s.assertUntouched(t)
}

func TestExtractCancelled(t *testing.T) {
	s := newSandbox(t)
	x, err := New(s.root, Options{})
	assert.NilError(t, err)
	defer x.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = x.Layer(ctx, bytes.NewReader(layerOf(t, file("a", "1"))))
	assert.Assert(t, errors.Is(err, context.Canceled))
}

func TestDecompress(t *testing.T) {
	raw := layerOf(t, file("hello", "world"))
	var gz, zs bytes.Buffer
	gw := gzip.NewWriter(&gz)
	_, _ = gw.Write(raw)
	assert.NilError(t, gw.Close())
	zw, err := zstd.NewWriter(&zs)
	assert.NilError(t, err)
	_, _ = zw.Write(raw)
	assert.NilError(t, zw.Close())
	for name, blob := range map[string][]byte{"tar": raw, "gzip": gz.Bytes(), "zstd": zs.Bytes(), "empty": nil} {
		t.Run(name, func(t *testing.T) {
			s := newSandbox(t)
			rc, err := Decompress(bytes.NewReader(blob))
			assert.NilError(t, err)
			defer rc.Close()
			x, err := New(s.root, Options{})
			assert.NilError(t, err)
			defer x.Close()
			assert.NilError(t, x.Layer(context.Background(), rc))
			if name != "empty" {
				assert.Equal(t, s.read(t, "hello"), "world")
			}
		})
	}
	_, err = Decompress(bytes.NewReader([]byte{0x1f, 0x8b, 0, 0}))
	assert.Check(t, is.ErrorContains(err, "gzip"))
}

// FuzzExtract throws arbitrary bytes (seeded with hostile layers) at the
// extractor: it must never panic and never touch anything beside its root.
func FuzzExtract(f *testing.F) {
	f.Add(layerOf(f, file("../x", "1")))
	f.Add(layerOf(f, symlink("up", "../../"), file("up/x", "1"), hardlink("h", "up/x")))
	f.Add(layerOf(f, symlink("abs", "/"), file("abs/etc/x", "1"), file("abs/.wh..wh..opq", "")))
	f.Add(layerOf(f, dir("d", 0o555), file("d/f", "1"), withMode(file("d/s", "1"), 0o6755), special("d/n", tar.TypeChar)))
	f.Add(layerOf(f, hardlink("x", "/sentinel/secret"), file("a/.wh.b", "")))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newSandbox(t)
		x, err := New(s.root, Options{Limits: Limits{MaxTotalBytes: 1 << 20, MaxFileBytes: 1 << 19, MaxEntries: 256}})
		assert.NilError(t, err)
		defer x.Close()
		if err := x.Layer(context.Background(), bytes.NewReader(data)); err != nil {
			var xe *Error
			if !errors.As(err, &xe) {
				t.Fatalf("error of unexpected type %T: %v", err, err)
			}
		}
		_ = x.Finish()
		s.assertUntouched(t)
	})
}

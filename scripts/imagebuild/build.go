package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

// builderVersion changes whenever the way an image is assembled changes,
// so the stamps of older builds stop matching.
const builderVersion = "imagebuild/4"

type builder struct {
	layout string
	work   string
	check  bool
	force  bool
	logf   func(string, ...any)
}

type result struct {
	skipped    bool
	digest     string
	packages   int
	layerBytes int64
}

// stamp records the inputs of the last build of an image.
type stamp struct {
	Inputs  string `json:"inputs"`  // recipe + apt lists
	Closure string `json:"closure"` // recipe + resolved package versions
	Digest  string `json:"digest"`
	Layer   int64  `json:"layer_bytes"`
	Count   int    `json:"packages"`
}

func (b *builder) stampPath(r Recipe) string { return filepath.Join(b.work, r.Name+".stamp.json") }

func (b *builder) readStamp(r Recipe) stamp {
	var s stamp
	if data, err := os.ReadFile(b.stampPath(r)); err == nil {
		_ = json.Unmarshal(data, &s)
	}
	return s
}

// inLayout tells whether the layout still holds digest under r.Ref.
func (b *builder) inLayout(r Recipe, digest string) bool {
	e, err := ocilayout.Find(b.layout, r.Ref)
	return err == nil && e != nil && e.Descriptor.Digest.String() == digest
}

func (b *builder) build(ctx context.Context, r Recipe) (result, error) {
	if err := os.MkdirAll(b.work, 0o755); err != nil {
		return result{}, err
	}
	apt, err := newApt(filepath.Join(b.work, "apt"))
	if err != nil {
		return result{}, err
	}
	recipeJSON, _ := json.Marshal(r)
	inputs := hashOf(builderVersion, string(recipeJSON), apt.listsFingerprint())
	old := b.readStamp(r)
	if !b.force && old.Inputs == inputs && b.inLayout(r, old.Digest) {
		return result{skipped: true, digest: old.Digest, packages: old.Count, layerBytes: old.Layer}, nil
	}

	// took logs how long each stage took, for scripts/bench and the docs'
	// build-time figures.
	mark := time.Now()
	took := func(stage string) {
		b.logf("%s: %s took %.1fs", r.Name, stage, time.Since(mark).Seconds())
		mark = time.Now()
	}
	b.logf("%s: resolving the package closure of %s", r.Name, strings.Join(r.Packages, " "))
	pkgs, dropped, err := apt.resolve(ctx, r.Packages, r.Exclude)
	if err != nil {
		return result{}, err
	}
	if len(dropped) > 0 {
		var names []string
		for _, p := range dropped {
			names = append(names, p.Name)
		}
		b.logf("%s: excluding %s drops %d packages: %s", r.Name, strings.Join(r.Exclude, " "), len(dropped), strings.Join(names, " "))
	}
	took("resolve")
	var ids []string
	for _, p := range pkgs {
		ids = append(ids, p.Name+"="+p.Version+":"+p.Arch)
	}
	closure := hashOf(builderVersion, string(recipeJSON), strings.Join(ids, "\n"))
	if !b.force && old.Closure == closure && b.inLayout(r, old.Digest) {
		old.Inputs = inputs
		if err := b.writeStamp(r, old); err != nil {
			return result{}, err
		}
		return result{skipped: true, digest: old.Digest, packages: old.Count, layerBytes: old.Layer}, nil
	}

	debDir := filepath.Join(b.work, "debs")
	debs, err := apt.download(ctx, debDir, pkgs, b.logf)
	if err != nil {
		return result{}, err
	}
	took("download")

	rootfs := filepath.Join(b.work, "rootfs-"+r.Name)
	_ = os.RemoveAll(rootfs)
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return result{}, err
	}
	defer os.RemoveAll(rootfs)
	b.logf("%s: unpacking %d packages", r.Name, len(debs))
	for _, d := range debs {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", d, rootfs).CombinedOutput(); err != nil {
			return result{}, fmt.Errorf("dpkg-deb -x %s: %v: %s", filepath.Base(d), err, out)
		}
	}
	epoch, err := newestFile(rootfs)
	if err != nil {
		return result{}, err
	}
	for _, p := range r.NPM {
		tgz, err := fetchNPM(ctx, filepath.Join(b.work, "npm"), p, b.logf)
		if err != nil {
			return result{}, err
		}
		if err := unpackNPM(tgz, rootfs, p); err != nil {
			return result{}, err
		}
	}
	if err := finishRoot(rootfs, r); err != nil {
		return result{}, err
	}
	took("unpack")
	if len(r.Bytecode) > 0 {
		b.logf("%s: compiling Python bytecode", r.Name)
		if err := compileBytecode(ctx, rootfs, r.Bytecode); err != nil {
			return result{}, err
		}
		took("bytecode")
	}
	if b.check {
		if err := smokeTest(ctx, rootfs, r); err != nil {
			return result{}, err
		}
		if err := clearCheckLeftovers(rootfs); err != nil {
			return result{}, err
		}
		b.logf("%s: chroot check passed: %s", r.Name, strings.Join(r.Check, " "))
		took("check")
	}

	layerPath := filepath.Join(b.work, r.Name+".layer.tar.gz")
	if err := writeLayer(rootfs, layerPath, epoch); err != nil {
		return result{}, err
	}
	defer os.Remove(layerPath)
	img, err := ociImage(layerPath, r, epoch)
	if err != nil {
		return result{}, err
	}
	digest, err := ocilayout.Put(b.layout, r.Ref, img)
	if err != nil {
		return result{}, fmt.Errorf("install into %s: %w", b.layout, err)
	}
	fi, err := os.Stat(layerPath)
	if err != nil {
		return result{}, err
	}
	took("layer")
	s := stamp{Inputs: inputs, Closure: closure, Digest: digest.String(), Layer: fi.Size(), Count: len(pkgs)}
	if err := b.writeStamp(r, s); err != nil {
		return result{}, err
	}
	return result{digest: s.Digest, packages: s.Count, layerBytes: s.Layer}, nil
}

func (b *builder) writeStamp(r Recipe, s stamp) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := b.stampPath(r) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, b.stampPath(r))
}

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// apt runs apt-get against the host's package lists but with a private,
// empty dpkg status and no preferences, so the closure is what a fresh
// system needs, whatever is installed or pinned on this host.
type apt struct {
	dir    string
	status string // the private dpkg status: empty
	opts   []string
}

func newApt(dir string) (*apt, error) {
	prefs := filepath.Join(dir, "preferences.d")
	if err := os.MkdirAll(prefs, 0o755); err != nil {
		return nil, err
	}
	status := filepath.Join(dir, "status")
	if err := os.WriteFile(status, nil, 0o644); err != nil {
		return nil, err
	}
	return &apt{dir: dir, status: status, opts: []string{
		"-q",
		"-o", "Dir::State::status=" + status,
		"-o", "Dir::Etc::Preferences=/dev/null",
		"-o", "Dir::Etc::PreferencesParts=" + prefs,
		"-o", "Dir::Cache::pkgcache=",
		"-o", "Dir::Cache::srcpkgcache=",
		"-o", "APT::Install-Recommends=false",
		"-o", "Debug::NoLocking=1",
	}}, nil
}

// listsFingerprint changes when `apt-get update` brought new package lists.
func (a *apt) listsFingerprint() string {
	var parts []string
	matches, _ := filepath.Glob("/var/lib/apt/lists/*_Packages*")
	sort.Strings(matches)
	for _, m := range matches {
		if fi, err := os.Stat(m); err == nil {
			parts = append(parts, fmt.Sprintf("%s %d %d", m, fi.Size(), fi.ModTime().UnixNano()))
		}
	}
	return strings.Join(parts, "\n")
}

type pkg struct{ Name, Version, Arch string }

// debName is the file name apt-get download gives a package.
func (p pkg) debName() string {
	return fmt.Sprintf("%s_%s_%s.deb", p.Name, strings.ReplaceAll(p.Version, ":", "%3a"), p.Arch)
}

// instLine keeps to Debian's character sets for names, versions and
// architectures, so nothing odd ever reaches a file name.
var instLine = regexp.MustCompile(`^Inst ([a-z0-9][a-z0-9+.-]*) \(([A-Za-z0-9.+~:-]+) .*\[([a-z0-9-]+)\]\)`)

// resolve returns the closure of roots without the packages in exclude and
// whatever only they pulled in (dropped lists those, sorted by name). Each
// excluded package must be in the closure of roots and not be a root: an
// exclude that no longer excludes anything is a stale recipe.
func (a *apt) resolve(ctx context.Context, roots, exclude []string) (pkgs, dropped []pkg, err error) {
	if len(exclude) == 0 {
		pkgs, err := a.simulate(ctx, roots, a.status)
		return pkgs, nil, err
	}
	for _, x := range exclude {
		if slices.Contains(roots, x) {
			return nil, nil, fmt.Errorf("exclude %s: it is one of the roots %v", x, roots)
		}
	}
	// The full closure (to check the excludes against) resolves while the
	// slim one does: each apt run reads all the package lists.
	type closure struct {
		pkgs []pkg
		err  error
	}
	fullc := make(chan closure, 1)
	go func() {
		p, err := a.simulate(ctx, roots, a.status)
		fullc <- closure{p, err}
	}()
	slim, err := a.simulateWithout(ctx, roots, exclude)
	full := <-fullc
	if full.err != nil {
		return nil, nil, full.err
	}
	if err != nil {
		return nil, nil, err
	}
	inFull := map[string]bool{}
	for _, p := range full.pkgs {
		inFull[p.Name] = true
	}
	inSlim := map[string]bool{}
	for _, p := range slim {
		inSlim[p.Name] = true
	}
	for _, x := range exclude {
		switch {
		case !inFull[x]:
			return nil, nil, fmt.Errorf("exclude %s: not in the closure of %v (a stale or misspelt exclude)", x, roots)
		case inSlim[x]:
			return nil, nil, fmt.Errorf("exclude %s: apt still installs it", x)
		}
	}
	// An alternative the full closure satisfied with a dropped package may
	// now be satisfied by another one, so slim is not always a subset.
	for _, p := range full.pkgs {
		if !inSlim[p.Name] {
			dropped = append(dropped, p)
		}
	}
	return slim, dropped, nil
}

// simulateWithout resolves roots on a system where the packages in exclude
// are already installed.
func (a *apt) simulateWithout(ctx context.Context, roots, exclude []string) ([]pkg, error) {
	stanzas, err := a.candidates(ctx, exclude)
	if err != nil {
		return nil, err
	}
	var status strings.Builder
	for _, c := range stanzas {
		status.WriteString(statusEntry(c))
	}
	path := filepath.Join(a.dir, "status-exclude")
	if err := os.WriteFile(path, []byte(status.String()), 0o644); err != nil {
		return nil, err
	}
	slim, err := a.simulate(ctx, roots, path)
	if err != nil {
		return nil, fmt.Errorf("with %v excluded: %w", exclude, err)
	}
	return slim, nil
}

// candidates returns the control data of the versions apt would install of
// names, one stanza each.
func (a *apt) candidates(ctx context.Context, names []string) ([]control, error) {
	args := append(append([]string{}, a.opts...), "show", "--no-all-versions")
	cmd := exec.CommandContext(ctx, "apt-cache", append(args, names...)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache show %v: %v: %s", names, err, lastLines(stderr.Bytes(), 10))
	}
	all, err := parseControl(out)
	if err != nil {
		return nil, fmt.Errorf("apt-cache show %v: %w", names, err)
	}
	var picked []control
	for _, n := range names {
		i := slices.IndexFunc(all, func(c control) bool { return c.Package == n })
		if i < 0 {
			return nil, fmt.Errorf("apt-cache show printed no stanza for %s", n)
		}
		picked = append(picked, all[i])
	}
	return picked, nil
}

// simulate returns the packages `apt-get -s install roots` would install
// on a system whose dpkg status is the file status.
func (a *apt) simulate(ctx context.Context, roots []string, status string) ([]pkg, error) {
	args := append(append([]string{}, a.opts...), "-o", "Dir::State::status="+status, "-s", "install")
	args = append(args, roots...)
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("apt-get -s install: %v: %s (run `apt-get update` if the package lists are missing)", err, lastLines(out, 10))
	}
	pkgs := parseSimulation(out)
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("apt resolved no packages for %v: %s", roots, lastLines(out, 10))
	}
	return pkgs, nil
}

// parseSimulation reads the "Inst name (version origins [arch])" lines of
// `apt-get -s install`, sorted by name so builds do not depend on apt's
// ordering.
func parseSimulation(out []byte) []pkg {
	var pkgs []pkg
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := instLine.FindStringSubmatch(sc.Text()); m != nil {
			pkgs = append(pkgs, pkg{Name: m[1], Version: m[2], Arch: m[3]})
		}
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
	return pkgs
}

// download fetches the .debs not yet in dir. apt-get verifies each against
// the signed package lists; it works in a scratch directory so a file in dir
// is always complete.
func (a *apt) download(ctx context.Context, dir string, pkgs []pkg, logf func(string, ...any)) ([]string, error) {
	partial := filepath.Join(dir, ".partial")
	if err := os.MkdirAll(partial, 0o755); err != nil {
		return nil, err
	}
	var missing []string
	var paths []string
	for _, p := range pkgs {
		path := filepath.Join(dir, p.debName())
		paths = append(paths, path)
		if _, err := os.Stat(path); err != nil {
			missing = append(missing, p.Name+"="+p.Version)
		}
	}
	if len(missing) > 0 {
		n := min(downloadConns, len(missing))
		logf("downloading %d packages over %d connections", len(missing), n)
		errs := make(chan error, n)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		for i := range n {
			var part []string
			for j := i; j < len(missing); j += n {
				part = append(part, missing[j])
			}
			go func() {
				err := a.downloadInto(ctx, filepath.Join(partial, strconv.Itoa(i)), dir, part)
				if err != nil {
					cancel()
				}
				errs <- err
			}()
		}
		var first error
		for range n {
			if err := <-errs; err != nil && (first == nil || errors.Is(first, context.Canceled)) {
				first = err
			}
		}
		if first != nil {
			return nil, first
		}
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("apt-get download did not produce %s", filepath.Base(p))
		}
	}
	return paths, nil
}

// downloadConns is how many apt-get downloads run at once. apt fetches
// one file at a time from a host; a few at once fill this machine's link
// (measured: 203 MB in 11.8-13.0 s serial, 7.7-8.3 s over 2 or 4).
const downloadConns = 4

// downloadInto runs one apt-get download of pkgs in the scratch directory
// scratch and moves each finished .deb into dir.
func (a *apt) downloadInto(ctx context.Context, scratch, dir string, pkgs []string) error {
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return err
	}
	args := append(append([]string{}, a.opts...), "download")
	cmd := exec.CommandContext(ctx, "apt-get", append(args, pkgs...)...)
	cmd.Dir = scratch
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("apt-get download: %v: %s", err, lastLines(out, 10))
	}
	entries, err := os.ReadDir(scratch)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".deb") {
			if err := os.Rename(filepath.Join(scratch, e.Name()), filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// newestFile returns the newest modification time of the packaged files:
// the image's timestamps are clamped to it, so the same packages always
// give the same layer digest.
func newestFile(root string) (time.Time, error) {
	var newest time.Time
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if fi.ModTime().After(newest) {
				newest = fi.ModTime()
			}
		}
		return nil
	})
	return newest.UTC().Truncate(time.Second), err
}

// finishRoot turns unpacked packages into a usable root: what maintainer
// scripts and base-files would have set up, minus what a sandbox never
// reads (documentation, manual pages, translations).
func finishRoot(root string, r Recipe) error {
	for _, p := range []string{"usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale"} {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			return err
		}
	}
	// Keep the copyright files: the licences travel with the binaries.
	docs := filepath.Join(root, "usr/share/doc")
	if err := filepath.WalkDir(docs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() && d.Name() != "copyright" {
			return os.Remove(p)
		}
		return nil
	}); err != nil {
		return err
	}

	dirs := []struct {
		path string
		mode fs.FileMode
	}{
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"run", 0o755}, {"mnt", 0o755},
		{"tmp", 0o1777}, {"var/tmp", 0o1777}, {"root", 0o700}, {"home", 0o755},
		{"etc/ssl/certs", 0o755}, {"usr/local/bin", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.path)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode|modeSticky(d.mode)); err != nil {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
		"etc/hosts":  "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	}
	bundle, err := caBundle(root)
	if err != nil {
		return err
	}
	if bundle != "" {
		files["etc/ssl/certs/ca-certificates.crt"] = bundle
	}
	for p, content := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for link, target := range r.Links {
		p := filepath.Join(root, link)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(target, p); err != nil {
			return err
		}
	}
	for _, need := range []string{"bin/sh", "usr/bin/env"} {
		if _, err := os.Stat(filepath.Join(root, need)); err != nil {
			return fmt.Errorf("the root has no /%s: %w", need, err)
		}
	}
	return nil
}

func modeSticky(m fs.FileMode) fs.FileMode {
	if m&0o1000 != 0 {
		return fs.ModeSticky
	}
	return 0
}

// caBundle concatenates the certificates ca-certificates ships, which is
// what its maintainer script (update-ca-certificates) would produce.
func caBundle(root string) (string, error) {
	certs, err := filepath.Glob(filepath.Join(root, "usr/share/ca-certificates/*/*.crt"))
	if err != nil || len(certs) == 0 {
		return "", err
	}
	sort.Strings(certs)
	var b strings.Builder
	for _, c := range certs {
		data, err := os.ReadFile(c)
		if err != nil {
			return "", err
		}
		b.Write(data)
		if !bytes.HasSuffix(data, []byte("\n")) {
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}

func smokeTest(ctx context.Context, root string, r Recipe) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "chroot", append([]string{root}, r.Check...)...)
	cmd.Env = r.Env
	cmd.Dir = "/"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("chroot check %v: %v: %s", r.Check, err, stderr.String())
	}
	if string(out) != r.Want {
		return fmt.Errorf("chroot check %v printed %q, want %q", r.Check, out, r.Want)
	}
	return nil
}

// compileBytecode compiles the Python modules under dirs with the image's
// own interpreter, run through the image's dynamic loader (so no chroot, and
// no root, is needed). The .pyc files are hash-checked against their source
// rather than its modification time, and name their source by its path in
// the image. Test directories are left out: they are large (sympy's alone
// would add 60 MB) and nothing imports them. Modules that do not compile
// (Python 2 examples, templates) get no .pyc, as with py3compile.
func compileBytecode(ctx context.Context, root string, dirs []string) error {
	loader := map[string]string{"amd64": "lib64/ld-linux-x86-64.so.2", "arm64": "lib/ld-linux-aarch64.so.1"}[runtime.GOARCH]
	if loader == "" {
		return fmt.Errorf("compile bytecode: no dynamic loader known for %s", runtime.GOARCH)
	}
	python, err := filepath.EvalSymlinks(filepath.Join(root, "usr/bin/python3"))
	if err != nil {
		return fmt.Errorf("compile bytecode: %w", err)
	}
	libs := root + "/lib/" + multiarch() + ":" + root + "/usr/lib/" + multiarch()
	// One run per directory, each with -d: the .pyc files then name their
	// sources by their paths in the image, wherever the root is built.
	for _, d := range dirs {
		dir := filepath.Join(root, d)
		cmd := exec.CommandContext(ctx, filepath.Join(root, loader), "--library-path", libs, python,
			"-m", "compileall", "-q", "-f", "-j0", "--invalidation-mode", "checked-hash",
			"-d", "/"+d, "-x", "^"+regexp.QuoteMeta(dir)+"/(.*/)?tests?/", dir)
		// PYTHONDONTWRITEBYTECODE: the modules the compiler itself imports
		// would otherwise get .pyc files naming their build paths.
		cmd.Env = []string{"PYTHONHOME=" + filepath.Join(root, "usr"), "PYTHONNOUSERSITE=1", "PYTHONDONTWRITEBYTECODE=1",
			"LC_ALL=C.UTF-8", "PYTHONHASHSEED=0"}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
			// compileall exits 1 when some module did not compile.
			return fmt.Errorf("compile bytecode in /%s: %v: %s", d, err, lastLines(out, 10))
		}
	}
	return nil
}

// clearCheckLeftovers empties /root, /tmp and /dev, where the check's
// programs leave caches and logs (matplotlib's font list, npm's timestamped
// debug log) and a shell redirection leaves a plain /dev/null: the layer
// must not depend on whether the check ran.
func clearCheckLeftovers(root string) error {
	for _, dir := range []string{"root", "tmp", "dev"} {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(root, dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeLayer writes root as a deterministic gzip'd tar: sorted entries,
// owner root, no access/change times, modification times clamped to epoch.
func writeLayer(root, out string, epoch time.Time) error {
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	bw := bufio.NewWriterSize(f, 1<<20)
	zw, err := gzip.NewWriterLevel(bw, gzip.DefaultCompression)
	if err != nil {
		f.Close()
		return err
	}
	tw := tar.NewWriter(zw)
	links := map[[2]uint64]string{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var target string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		hdr.ModTime = fi.ModTime().UTC().Truncate(time.Second)
		if hdr.ModTime.After(epoch) {
			hdr.ModTime = epoch
		}
		hdr.Format = tar.FormatPAX
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			key := [2]uint64{uint64(st.Dev), st.Ino} //nolint:unconvert // Stat_t.Dev is not uint64 on every GOARCH (mips: uint32)
			if first, seen := links[key]; seen {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				return tw.WriteHeader(hdr)
			}
			links[key] = hdr.Name
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			return err
		}
		return nil
	})
	for _, closer := range []func() error{tw.Close, zw.Close, bw.Flush, f.Close} {
		if cerr := closer(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("write layer: %w", err)
	}
	return os.Rename(tmp, out)
}

func ociImage(layerPath string, r Recipe, epoch time.Time) (v1.Image, error) {
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base, err := mutate.ConfigFile(mutate.MediaType(empty.Image, types.OCIManifestSchema1), &v1.ConfigFile{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Created:      v1.Time{Time: epoch},
		Config: v1.Config{
			Env:        r.Env,
			Cmd:        r.Cmd,
			WorkingDir: "/root",
			Labels: map[string]string{
				"org.opencontainers.image.ref.name":    r.Ref,
				"org.opencontainers.image.description": description(r),
			},
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	return mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: epoch}, CreatedBy: builderVersion + " " + strings.Join(r.Packages, " ")},
	})
}

// description says what the image is made of: the Debian roots and the
// npm packages over them.
func description(r Recipe) string {
	d := "iii sandbox preset " + r.Name + ", built from Debian packages: " + strings.Join(r.Packages, " ")
	if len(r.NPM) > 0 {
		var specs []string
		for _, p := range r.NPM {
			specs = append(specs, p.Spec)
		}
		d += "; and npm packages: " + strings.Join(specs, " ")
	}
	return d
}

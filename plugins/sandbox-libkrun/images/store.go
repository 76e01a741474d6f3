// Package images installs OCI images as read-only block images for
// sandbox VMs.
//
// Ensure finds an image in the local OCI layout (images loaded without a
// registry, e.g. by scripts/build-images.sh) or pulls it from a registry,
// verifies every blob against its digest, unpacks the layers with the safe
// extractor of package extract, and builds one erofs image per manifest
// digest that every sandbox of that image shares. The cache is always
// consistent: work happens in a scratch directory that is renamed into
// place only when complete.
//
// Cache layout under Options.Root (default ~/.iii/cache):
//
//	oci/                                   local OCI layout (refs by annotation)
//	images/sha256/<manifest hex>/          one installed image:
//	    rootfs.erofs                         the read-only root file system
//	    image.json                           config (env, workdir, user, ...)
//	images/refs/<sha256 of ref>.json       ref -> manifest digest
//	images/blobs/sha256/<hex>              verified layers of an unfinished pull
//	images/tmp/                            scratch space of running installs
package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/internal/atomicfile"
	extract "github.com/iii-sandbox/iii/internal/tarextract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

// Compression of the erofs image.
type Compression string

const (
	// CompressionNone builds an uncompressed erofs image: nothing to
	// decompress in the guest, which matters under TCG where every guest
	// instruction is emulated.
	CompressionNone Compression = "none"
	// CompressionLZ4HC makes images about half the size for slower builds.
	CompressionLZ4HC Compression = "lz4hc"
	// CompressionLZ4 is faster to build than lz4hc, a little larger.
	CompressionLZ4 Compression = "lz4"
)

// Credential authenticates to one registry host.
type Credential struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// Token is a registry identity token (OAuth2 refresh token) or, with
	// no Username, a bearer token sent as is.
	Token string `json:"token,omitempty"`
}

// Options configure a Store. Zero values take the documented defaults.
type Options struct {
	// Root of the cache. Default: ~/.iii/cache.
	Root string
	// LocalLayouts are OCI layouts searched, in order, before any registry.
	// Default: [<Root>/oci].
	LocalLayouts []string
	// Mirrors maps a registry host (docker.io, ghcr.io, 127.0.0.1:5000) to
	// the base URL that serves it instead ("http://127.0.0.1:5000",
	// "https://mirror.example"). A mirror replaces the host; there is no
	// fallback to the original, so a mirrored setup never reaches out.
	Mirrors map[string]string
	// Insecure allows plain-HTTP mirrors and registries that are not on a
	// loopback address (loopback is always allowed).
	Insecure bool
	// Credentials by registry host, tried before Keychain.
	Credentials map[string]Credential
	// Keychain resolves credentials for hosts without explicit ones.
	// Default: the Docker config keychain (~/.docker/config.json, helpers).
	Keychain authn.Keychain
	// Transport for registry requests. Default: the library's default.
	Transport http.RoundTripper
	// Platform chosen from multi-platform indexes. Default linux/GOARCH.
	Platform *v1.Platform
	// Limits of unpacked content; see extract.DefaultLimits.
	Limits extract.Limits
	// MaxDownloadBytes caps the compressed size of an image's layers as
	// declared by its manifest, checked before any layer is fetched.
	// Default 4 GiB.
	MaxDownloadBytes int64
	// Compression of rootfs.erofs. Default CompressionNone (see there).
	Compression Compression
	// MkfsErofs is the mkfs.erofs binary. Default: found in PATH.
	MkfsErofs string
	Logger    hclog.Logger
	// Now is the clock (tests).
	Now func() time.Time
}

// EnsureOptions tune one Ensure call.
type EnsureOptions struct {
	// AutoInstall allows pulling from a registry. Without it, only cached
	// and locally loaded images are used (the adapter's auto_install).
	AutoInstall bool
	// Refresh asks the registry again for a tag that is already cached.
	Refresh bool
	// Progress receives reports while this call waits for an install.
	Progress func(Progress)
}

// Progress is one report of a running install. Total is -1 when unknown.
type Progress struct {
	Phase Phase `json:"phase"`
	Done  int64 `json:"done"`
	Total int64 `json:"total"`
}

// Image is an installed image.
type Image struct {
	// Ref is the canonical reference it was ensured as.
	Ref string
	// Digest of the platform manifest ("sha256:…").
	Digest string
	// Dir holds RootfsPath and ConfigPath.
	Dir        string
	RootfsPath string
	ConfigPath string
	Config     ImageConfig
}

// ImageConfig is image.json: what the VM needs to run the image's
// programs, kept beside the block image.
type ImageConfig struct {
	Ref          string        `json:"ref"`
	Digest       string        `json:"digest"`
	ConfigDigest string        `json:"config_digest"`
	Platform     string        `json:"platform"`
	Source       string        `json:"source"`
	Env          []string      `json:"env"`
	WorkingDir   string        `json:"working_dir"`
	User         string        `json:"user"`
	Entrypoint   []string      `json:"entrypoint"`
	Cmd          []string      `json:"cmd"`
	Layers       []string      `json:"layers"`
	Compression  Compression   `json:"compression"`
	BlockBytes   int64         `json:"block_bytes"`
	Unpacked     extract.Stats `json:"unpacked"`
	InstalledAt  time.Time     `json:"installed_at"`
}

// Store is the image cache. It is safe for concurrent use, and several
// processes may share one Root.
type Store struct {
	opts    Options
	log     hclog.Logger
	flights flights
}

// DefaultRoot is ~/.iii/cache, where iii keeps pulled images.
func DefaultRoot() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find home directory: %w", err)
	}
	return filepath.Join(home, ".iii", "cache"), nil
}

// Open prepares a store, creating its directories.
func Open(opts Options) (*Store, error) {
	if opts.Root == "" {
		r, err := DefaultRoot()
		if err != nil {
			return nil, err
		}
		opts.Root = r
	}
	if opts.LocalLayouts == nil {
		opts.LocalLayouts = []string{filepath.Join(opts.Root, "oci")}
	}
	if opts.Keychain == nil {
		opts.Keychain = authn.DefaultKeychain
	}
	if opts.Platform == nil {
		opts.Platform = &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	}
	if opts.MaxDownloadBytes <= 0 {
		opts.MaxDownloadBytes = 4 << 30
	}
	switch opts.Compression {
	case "":
		opts.Compression = CompressionNone
	case CompressionNone, CompressionLZ4, CompressionLZ4HC:
	default:
		return nil, fmt.Errorf("unknown erofs compression %q (want none, lz4 or lz4hc)", opts.Compression)
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if _, err := parseMirrors(opts.Mirrors, opts.Insecure); err != nil {
		return nil, err
	}
	for _, d := range []string{"sha256", "refs", "blobs/sha256", "tmp"} {
		if err := os.MkdirAll(filepath.Join(opts.Root, "images", d), 0o755); err != nil {
			return nil, fmt.Errorf("create image cache: %w", err)
		}
	}
	s := &Store{opts: opts, log: opts.Logger.Named("images")}
	s.sweepTmp()
	return s, nil
}

// Close waits for running installs to end. Callers cancel their Ensure
// contexts first to make that quick.
func (s *Store) Close() error {
	s.flights.wait()
	return nil
}

// Root returns the cache root.
func (s *Store) Root() string { return s.opts.Root }

func (s *Store) imagesDir(parts ...string) string {
	return filepath.Join(append([]string{s.opts.Root, "images"}, parts...)...)
}

func (s *Store) digestDir(d v1.Hash) string { return s.imagesDir(d.Algorithm, d.Hex) }

func refKey(canon string) string {
	sum := sha256.Sum256([]byte(canon))
	return hex.EncodeToString(sum[:])
}

type refRecord struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

func (s *Store) refDigest(canon string) (v1.Hash, bool) {
	b, err := os.ReadFile(s.imagesDir("refs", refKey(canon)+".json"))
	if err != nil {
		return v1.Hash{}, false
	}
	var rec refRecord
	if json.Unmarshal(b, &rec) != nil || rec.Ref != canon {
		return v1.Hash{}, false
	}
	h, err := v1.NewHash(rec.Digest)
	if err != nil {
		return v1.Hash{}, false
	}
	return h, true
}

func (s *Store) writeRef(canon string, d v1.Hash) error {
	b, err := json.Marshal(refRecord{Ref: canon, Digest: d.String()})
	if err != nil {
		return err
	}
	return atomicfile.Write(s.imagesDir("refs", refKey(canon)+".json"), b, 0o644)
}

// installed loads the image of digest d if it is complete in the cache.
func (s *Store) installed(canon string, d v1.Hash) (*Image, bool) {
	dir := s.digestDir(d)
	b, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if err != nil {
		return nil, false
	}
	var cfg ImageConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, false
	}
	if _, err := os.Stat(filepath.Join(dir, "rootfs.erofs")); err != nil {
		return nil, false
	}
	return &Image{
		Ref:        canon,
		Digest:     d.String(),
		Dir:        dir,
		RootfsPath: filepath.Join(dir, "rootfs.erofs"),
		ConfigPath: filepath.Join(dir, "image.json"),
		Config:     cfg,
	}, true
}

// Lookup returns the installed image for ref without installing anything.
// A ref that is not installed gives a *NotInstalledError.
func (s *Store) Lookup(ref string) (*Image, error) {
	canon, err := ocilayout.CanonicalRef(ref)
	if err != nil {
		return nil, err
	}
	if d, ok := digestOf(canon); ok {
		if img, ok := s.installed(canon, d); ok {
			return img, nil
		}
	}
	if d, ok := s.refDigest(canon); ok {
		if img, ok := s.installed(canon, d); ok {
			return img, nil
		}
	}
	return nil, &NotInstalledError{Ref: canon}
}

// digestOf returns the digest of a by-digest reference.
func digestOf(canon string) (v1.Hash, bool) {
	_, d, ok := strings.Cut(canon, "@")
	if !ok {
		return v1.Hash{}, false
	}
	h, err := v1.NewHash(d)
	return h, err == nil
}

// Ensure returns the installed image for ref, installing it if needed.
// Concurrent calls for the same ref share one installation.
//
// Sources, in order: the local OCI layouts (always allowed, they need no
// network; a rebuilt local image replaces the cached one), the cache, then
// the registry (only with AutoInstall).
func (s *Store) Ensure(ctx context.Context, ref string, eo EnsureOptions) (*Image, error) {
	canon, err := ocilayout.CanonicalRef(ref)
	if err != nil {
		return nil, &InstallError{Ref: ref, Phase: PhaseResolving, Err: err}
	}
	// Callers with different options must not share a result: a pull that
	// one caller may not make is still one another caller may.
	key := fmt.Sprintf("%s|auto=%t|refresh=%t", canon, eo.AutoInstall, eo.Refresh)
	return s.flights.do(ctx, key, eo.Progress, func(ctx context.Context, report func(Progress)) (*Image, error) {
		return s.ensure(ctx, canon, eo, report)
	})
}

func (s *Store) ensure(ctx context.Context, canon string, eo EnsureOptions, report func(Progress)) (*Image, error) {
	local, err := s.findLocal(canon)
	if err != nil {
		return nil, &InstallError{Ref: canon, Phase: PhaseResolving, Err: err}
	}
	if local != nil {
		if img, ok := s.installed(canon, local.digest); ok {
			return img, s.writeRef(canon, local.digest)
		}
		return s.install(ctx, canon, local, report)
	}
	if d, ok := digestOf(canon); ok {
		if img, ok := s.installed(canon, d); ok {
			return img, nil
		}
	} else if !eo.Refresh {
		if d, ok := s.refDigest(canon); ok {
			if img, ok := s.installed(canon, d); ok {
				return img, nil
			}
		}
	}
	if !eo.AutoInstall {
		return nil, &NotInstalledError{Ref: canon}
	}
	report(Progress{Phase: PhaseResolving, Total: -1})
	src, err := s.resolveRemote(ctx, canon)
	if err != nil {
		return nil, &InstallError{Ref: canon, Phase: PhaseResolving, Err: err}
	}
	if img, ok := s.installed(canon, src.digest); ok {
		return img, s.writeRef(canon, src.digest)
	}
	return s.install(ctx, canon, src, report)
}

// sweepTmp removes scratch directories and downloaded layers that no
// install has touched for a day: what a killed process or an abandoned pull
// left behind. A retry within the day still resumes from the kept layers.
func (s *Store) sweepTmp() {
	if blobs, err := os.ReadDir(s.imagesDir("blobs", "sha256")); err == nil {
		for _, b := range blobs {
			if fi, err := b.Info(); err == nil && s.opts.Now().Sub(fi.ModTime()) >= 24*time.Hour {
				_ = os.Remove(s.imagesDir("blobs", "sha256", b.Name()))
			}
		}
	}
	entries, err := os.ReadDir(s.imagesDir("tmp"))
	if err != nil {
		return
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || s.opts.Now().Sub(fi.ModTime()) < 24*time.Hour {
			continue
		}
		p := s.imagesDir("tmp", e.Name())
		_ = makeWritable(p)
		if err := os.RemoveAll(p); err != nil {
			s.log.Warn("cannot remove stale scratch dir", "path", p, "error", err)
		}
	}
}

// makeWritable gives the owner write access to every directory under p, so
// an unprivileged RemoveAll can delete a tree that had read-only dirs.
func makeWritable(p string) error {
	return filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			if fi, err := d.Info(); err == nil && fi.Mode().Perm()&0o700 != 0o700 {
				_ = os.Chmod(path, fi.Mode().Perm()|0o700)
			}
		}
		return nil
	})
}

var errNoPlatform = errors.New("no manifest for the wanted platform")

package initramfs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// formatVersion changes whenever the archive layout changes, so cached
// archives of an older layout are not reused.
const formatVersion = "iii-initramfs 1"

// Options says what goes into an initramfs.
type Options struct {
	// AgentPath is the guest agent binary, built static for the guest's
	// architecture; it becomes /init.
	AgentPath string
	// ModulesDir is the kernel's module directory (/lib/modules/<version>).
	// Empty means the kernel has everything built in.
	ModulesDir string
	// Modules are the module names to load; dependencies are added. Nil
	// means DefaultModules().
	Modules []string
	// KernelConfig is the kernel's build configuration, which tells
	// whether it can load compressed modules itself. Empty means
	// /boot/config-<version of ModulesDir> when that exists; without a
	// config, compressed modules are decompressed here.
	KernelConfig string
	// CacheDir holds built archives, named by the hash of their inputs.
	CacheDir string
	// Extra files, for tests and debugging images.
	Extra []File
}

// File is an extra file for the archive.
type File struct {
	Path    string // absolute path in the guest
	Mode    uint32 // permission bits
	Data    []byte
	Symlink string // when set, the entry is a symlink to this target
}

type moduleEntry struct {
	src        string // file on the host
	dst        string // path in the archive
	decompress string // "", "gz", "xz" or "zst": decompress while packing
}

// Build returns the path of an initramfs for opts, building it into
// CacheDir unless an identical one is already there.
func Build(ctx context.Context, opts Options) (string, error) {
	if opts.AgentPath == "" || opts.CacheDir == "" {
		return "", errors.New("initramfs: AgentPath and CacheDir are required")
	}
	mods, err := planModules(opts)
	if err != nil {
		return "", err
	}
	key, err := cacheKey(ctx, opts, mods)
	if err != nil {
		return "", err
	}
	out := filepath.Join(opts.CacheDir, "initramfs-"+key[:32]+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return "", fmt.Errorf("initramfs: cache dir: %w", err)
	}
	tmp, err := os.CreateTemp(opts.CacheDir, ".initramfs-*.tmp")
	if err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := write(ctx, tmp, opts, mods); err != nil {
		_ = tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	// Rename makes the archive appear whole; two builders racing produce
	// the same bytes, so either one winning is fine.
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	return out, nil
}

func planModules(opts Options) ([]moduleEntry, error) {
	if opts.ModulesDir == "" {
		return nil, nil
	}
	db, err := LoadModuleDB(opts.ModulesDir)
	if err != nil {
		return nil, err
	}
	names := opts.Modules
	if names == nil {
		names = DefaultModules()
	}
	paths, err := db.Resolve(names)
	if err != nil {
		return nil, err
	}
	cfgPath := opts.KernelConfig
	if cfgPath == "" {
		cfgPath = filepath.Join("/boot", "config-"+filepath.Base(filepath.Clean(opts.ModulesDir)))
	}
	var kc KernelConfig
	if b, err := os.ReadFile(cfgPath); err == nil {
		kc = ParseKernelConfig(string(b))
	} else if opts.KernelConfig != "" {
		return nil, fmt.Errorf("initramfs: kernel config: %w", err)
	}
	out := make([]moduleEntry, 0, len(paths))
	for _, p := range paths {
		src := p
		if !filepath.IsAbs(src) {
			src = filepath.Join(opts.ModulesDir, p)
		}
		base := path.Base(p)
		e := moduleEntry{src: src, dst: agentproto.ModulesDir + "/" + base}
		if format := compression(base); format != "" && !kc.CanDecompress(format) {
			e.decompress = format
			e.dst = agentproto.ModulesDir + "/" + strings.TrimSuffix(base, "."+format)
		}
		out = append(out, e)
	}
	return out, nil
}

func compression(name string) string {
	for _, f := range []string{"gz", "xz", "zst"} {
		if strings.HasSuffix(name, ".ko."+f) {
			return f
		}
	}
	return ""
}

// KernelConfig holds the options of a kernel build configuration that
// matter here.
type KernelConfig map[string]string

// ParseKernelConfig reads a kernel .config ("CONFIG_X=y" lines).
func ParseKernelConfig(s string) KernelConfig {
	kc := KernelConfig{}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && strings.HasPrefix(k, "CONFIG_") {
			kc[k] = v
		}
	}
	return kc
}

// CanDecompress reports whether the kernel decompresses modules of format
// ("gz", "xz", "zst") itself: it needs MODULE_DECOMPRESS and is built for
// one compression only.
func (kc KernelConfig) CanDecompress(format string) bool {
	if kc["CONFIG_MODULE_DECOMPRESS"] != "y" {
		return false
	}
	opt := map[string]string{"gz": "CONFIG_MODULE_COMPRESS_GZIP", "xz": "CONFIG_MODULE_COMPRESS_XZ", "zst": "CONFIG_MODULE_COMPRESS_ZSTD"}[format]
	return opt != "" && kc[opt] == "y"
}

func cacheKey(ctx context.Context, opts Options, mods []moduleEntry) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", formatVersion)
	hashFile := func(p string) error {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		defer f.Close()
		_, err = io.Copy(h, f)
		return err
	}
	fmt.Fprintf(h, "agent\n")
	if err := hashFile(opts.AgentPath); err != nil {
		return "", err
	}
	for _, m := range mods {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		fmt.Fprintf(h, "\nmodule %q %q\n", m.dst, m.decompress)
		if err := hashFile(m.src); err != nil {
			return "", err
		}
	}
	for _, f := range opts.Extra {
		fmt.Fprintf(h, "\nextra %q %o %q %d\n", f.Path, f.Mode, f.Symlink, len(f.Data))
		h.Write(f.Data)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func write(ctx context.Context, w io.Writer, opts Options, mods []moduleEntry) error {
	cw := NewWriter(w)
	for _, d := range []struct {
		name string
		perm uint32
	}{{"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"tmp", 0o1777}, {"run", 0o755}, {"root", 0o700}, {"iii", 0o755}} {
		if err := cw.Mkdir(d.name, d.perm); err != nil {
			return err
		}
	}
	// With /dev/console in the archive the kernel opens it as the init's
	// stdin, stdout and stderr before devtmpfs is mounted.
	if err := cw.CharDev("dev/console", 0o600, 5, 1); err != nil {
		return err
	}
	if err := addHostFile(cw, "init", opts.AgentPath, 0o755, ""); err != nil {
		return err
	}
	var manifest []string
	for _, m := range mods {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := addHostFile(cw, strings.TrimPrefix(m.dst, "/"), m.src, 0o644, m.decompress); err != nil {
			return err
		}
		manifest = append(manifest, m.dst)
	}
	if len(mods) > 0 {
		mf := agentproto.FormatModuleManifest(manifest)
		if err := cw.WriteFile(strings.TrimPrefix(agentproto.ModuleManifestPath, "/"), 0o644, int64(len(mf)), strings.NewReader(mf)); err != nil {
			return err
		}
	}
	for _, f := range opts.Extra {
		name := strings.TrimPrefix(f.Path, "/")
		var err error
		if f.Symlink != "" {
			err = cw.Symlink(name, f.Symlink)
		} else {
			err = cw.WriteFile(name, f.Mode, int64(len(f.Data)), bytes.NewReader(f.Data))
		}
		if err != nil {
			return err
		}
	}
	return cw.Close()
}

// addHostFile packs a file from the host, decompressing it first when
// format is set.
func addHostFile(cw *Writer, name, src string, perm uint32, format string) error {
	f, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer f.Close()
	if format == "" {
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		return cw.WriteFile(name, perm, fi.Size(), bufio.NewReader(f))
	}
	data, err := decompress(format, f)
	if err != nil {
		return fmt.Errorf("initramfs: decompress %s: %w", src, err)
	}
	return cw.WriteFile(name, perm, int64(len(data)), bytes.NewReader(data))
}

// maxModuleBytes bounds a decompressed module; the largest in-tree
// modules are a few tens of MiB.
const maxModuleBytes = 256 << 20

func decompress(format string, r io.Reader) ([]byte, error) {
	var dr io.Reader
	switch format {
	case "gz":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		dr = zr
	case "xz":
		xr, err := xz.NewReader(r)
		if err != nil {
			return nil, err
		}
		dr = xr
	case "zst":
		zr, err := zstd.NewReader(r)
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		dr = zr
	default:
		return nil, fmt.Errorf("unknown compression %q", format)
	}
	data, err := io.ReadAll(io.LimitReader(dr, maxModuleBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxModuleBytes {
		return nil, fmt.Errorf("module larger than %d MiB once decompressed", maxModuleBytes>>20)
	}
	return data, nil
}

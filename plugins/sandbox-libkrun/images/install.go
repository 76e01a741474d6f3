package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	extract "github.com/iii-sandbox/iii/internal/tarextract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

// Caps on the small JSON documents of an image: a hostile registry must not
// make the store buffer gigabytes before any layer limit applies.
const (
	maxConfigBytes = 8 << 20
	maxLayers      = 256
)

func (s *Store) install(ctx context.Context, canon string, src *source, report func(Progress)) (*Image, error) {
	phase := PhaseResolving
	fail := func(err error) (*Image, error) {
		if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, &InstallError{Ref: canon, Phase: phase, Err: err}
	}

	m, err := src.img.Manifest()
	if err != nil {
		return fail(fmt.Errorf("read manifest: %w", err))
	}
	if err := s.checkManifest(m); err != nil {
		return fail(err)
	}
	cf, err := src.img.ConfigFile()
	if err != nil {
		return fail(fmt.Errorf("read image config: %w", err))
	}

	tmp, err := os.MkdirTemp(s.imagesDir("tmp"), src.digest.Hex[:12]+"-")
	if err != nil {
		return fail(err)
	}
	defer func() {
		_ = makeWritable(tmp)
		_ = os.RemoveAll(tmp)
	}()

	// Pull: registry layers are downloaded and verified before a single
	// byte reaches the extractor. Verified blobs stay in images/blobs until
	// the image is built, so a retry resumes where this attempt stopped.
	layerPaths := make([]string, len(m.Layers))
	var total int64
	for _, l := range m.Layers {
		total += l.Size
	}
	var pulled []string
	if src.kind == "local" {
		for i, l := range m.Layers {
			layerPaths[i] = ocilayout.BlobPath(src.layout, l.Digest)
		}
	} else {
		phase = PhasePulling
		var done int64
		report(Progress{Phase: PhasePulling, Done: 0, Total: total})
		for i, l := range m.Layers {
			p, err := s.pullLayer(ctx, src.img, l, func(n int64) {
				report(Progress{Phase: PhasePulling, Done: done + n, Total: total})
			})
			if err != nil {
				return fail(err)
			}
			pulled = append(pulled, p)
			// A link of our own: another install that shares this layer
			// may delete the cached blob once it is done with it.
			own := filepath.Join(tmp, fmt.Sprintf("layer-%d", i))
			if err := os.Link(p, own); err != nil {
				return fail(err)
			}
			layerPaths[i] = own
			done += l.Size
		}
	}

	// Unpack, checking every blob's digest on the way again: a cached or
	// locally loaded blob may have changed on disk since it was verified.
	phase = PhaseUnpacking
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return fail(err)
	}
	chown := os.Geteuid() == 0
	x, err := extract.New(rootfs, extract.Options{Limits: s.opts.Limits, Chown: chown})
	if err != nil {
		return fail(err)
	}
	var done int64
	report(Progress{Phase: PhaseUnpacking, Done: 0, Total: total})
	for i, l := range m.Layers {
		err := s.unpackLayer(ctx, x, layerPaths[i], l, func(n int64) {
			report(Progress{Phase: PhaseUnpacking, Done: done + n, Total: total})
		})
		if err != nil {
			x.Close()
			return fail(fmt.Errorf("layer %d (%s): %w", i+1, l.Digest, err))
		}
		done += l.Size
	}
	if err := x.Finish(); err != nil {
		x.Close()
		return fail(err)
	}
	stats := x.Stats()
	x.Close()

	// Build the block image.
	phase = PhaseBuilding
	report(Progress{Phase: PhaseBuilding, Done: 0, Total: stats.Bytes})
	final := filepath.Join(tmp, "image")
	if err := os.Mkdir(final, 0o755); err != nil {
		return fail(err)
	}
	blockPath := filepath.Join(final, "rootfs.erofs")
	if err := s.mkfs(ctx, blockPath, rootfs, !chown); err != nil {
		return fail(err)
	}
	fi, err := os.Stat(blockPath)
	if err != nil {
		return fail(err)
	}
	cfgName, _ := src.img.ConfigName()
	ic := ImageConfig{
		Ref:          canon,
		Digest:       src.digest.String(),
		ConfigDigest: cfgName.String(),
		Platform:     src.platform,
		Source:       src.kind,
		Env:          cf.Config.Env,
		WorkingDir:   cf.Config.WorkingDir,
		User:         cf.Config.User,
		Entrypoint:   cf.Config.Entrypoint,
		Cmd:          cf.Config.Cmd,
		Compression:  s.opts.Compression,
		BlockBytes:   fi.Size(),
		Unpacked:     stats,
		InstalledAt:  s.opts.Now().UTC().Truncate(time.Second),
	}
	for _, l := range m.Layers {
		ic.Layers = append(ic.Layers, l.Digest.String())
	}
	b, err := json.MarshalIndent(ic, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(final, "image.json"), b, 0o644); err != nil {
		return fail(err)
	}
	if err := syncDir(final); err != nil {
		return fail(err)
	}
	report(Progress{Phase: PhaseBuilding, Done: stats.Bytes, Total: stats.Bytes})

	// Publish: one rename makes the image visible, complete.
	dest := s.digestDir(src.digest)
	if err := os.Rename(final, dest); err != nil {
		if _, ok := s.installed(canon, src.digest); !ok {
			return fail(fmt.Errorf("publish %s: %w", dest, err))
		}
		// Another process installed the same digest meanwhile: use theirs.
	}
	if err := s.writeRef(canon, src.digest); err != nil {
		return fail(err)
	}
	for _, p := range pulled {
		_ = os.Remove(p)
	}
	img, ok := s.installed(canon, src.digest)
	if !ok {
		return fail(fmt.Errorf("installed image %s vanished", dest))
	}
	s.log.Info("image installed", "ref", canon, "digest", src.digest.String(), "source", src.kind, "bytes", stats.Bytes, "block_bytes", fi.Size())
	return img, nil
}

func (s *Store) checkManifest(m *v1.Manifest) error {
	if len(m.Layers) > maxLayers {
		return fmt.Errorf("image has %d layers, more than %d", len(m.Layers), maxLayers)
	}
	if m.Config.Size > maxConfigBytes {
		return fmt.Errorf("image config claims %d bytes, more than %d", m.Config.Size, maxConfigBytes)
	}
	var total int64
	for i, l := range m.Layers {
		if l.Size < 0 {
			return fmt.Errorf("layer %d has a negative size", i+1)
		}
		if l.Size > s.opts.MaxDownloadBytes {
			return fmt.Errorf("layer %d (%s) claims %d bytes, more than the %d byte cap", i+1, l.Digest, l.Size, s.opts.MaxDownloadBytes)
		}
		total += l.Size
		if total > s.opts.MaxDownloadBytes {
			return fmt.Errorf("layers claim more than the %d byte cap", s.opts.MaxDownloadBytes)
		}
		if l.Digest.Algorithm != "sha256" || len(l.Digest.Hex) != 64 {
			return fmt.Errorf("layer %d has unsupported digest %q", i+1, l.Digest)
		}
	}
	return nil
}

// pullLayer downloads one layer into images/blobs, checking its size and
// digest, unless a previous attempt already did.
func (s *Store) pullLayer(ctx context.Context, img v1.Image, desc v1.Descriptor, progress func(int64)) (string, error) {
	final := s.imagesDir("blobs", desc.Digest.Algorithm, desc.Digest.Hex)
	if fi, err := os.Stat(final); err == nil && fi.Size() == desc.Size {
		progress(desc.Size)
		return final, nil
	}
	layer, err := img.LayerByDigest(desc.Digest)
	if err != nil {
		return "", err
	}
	rc, err := layer.Compressed()
	if err != nil {
		return "", fmt.Errorf("fetch layer %s: %w", desc.Digest, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(filepath.Dir(final), ".tmp-"+desc.Digest.Hex)
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	// One byte more than declared is enough to know the registry lies.
	cr := &countingReader{ctx: ctx, r: io.LimitReader(rc, desc.Size+1), progress: progress}
	_, err = io.Copy(io.MultiWriter(f, h), cr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("download layer %s: %w", desc.Digest, err)
	}
	if err := verify(desc, cr.n, h); err != nil {
		return "", err
	}
	if err := os.Rename(f.Name(), final); err != nil {
		return "", err
	}
	return final, nil
}

func (s *Store) unpackLayer(ctx context.Context, x *extract.Extractor, blob string, desc v1.Descriptor, progress func(int64)) error {
	f, err := os.Open(blob)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	cr := &countingReader{ctx: ctx, r: io.LimitReader(f, desc.Size+1), progress: progress}
	tee := io.TeeReader(cr, h)
	tr, err := extract.Decompress(tee)
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := x.Layer(ctx, tr); err != nil {
		return err
	}
	// The tar may end before the blob does (padding, trailing frames):
	// hash the rest too, or the digest check would reject a valid blob.
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return err
	}
	return verify(desc, cr.n, h)
}

func verify(desc v1.Descriptor, n int64, h hash.Hash) error {
	if n != desc.Size {
		return fmt.Errorf("layer %s: got %d bytes, the manifest says %d", desc.Digest, n, desc.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != desc.Digest.Hex {
		return fmt.Errorf("layer %s: content has digest sha256:%s", desc.Digest, got)
	}
	return nil
}

// countingReader counts bytes, reports them and stops on cancellation.
type countingReader struct {
	ctx      context.Context
	r        io.Reader
	n        int64
	progress func(int64)
	last     int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	// Report every MiB and at EOF: often enough for a progress bar,
	// rarely enough to cost nothing.
	if c.progress != nil && (c.n-c.last >= 1<<20 || (err == io.EOF && c.n != c.last)) {
		c.last = c.n
		c.progress(c.n)
	}
	return n, err
}

// mkfs builds the erofs image of dir.
func (s *Store) mkfs(ctx context.Context, out, dir string, allRoot bool) error {
	bin := s.opts.MkfsErofs
	if bin == "" {
		p, err := exec.LookPath("mkfs.erofs")
		if err != nil {
			return fmt.Errorf("mkfs.erofs not found: install erofs-utils (scripts/setup-vm.sh does): %w", err)
		}
		bin = p
	}
	args := []string{"--quiet"}
	switch s.opts.Compression {
	case CompressionLZ4:
		args = append(args, "-zlz4")
	case CompressionLZ4HC:
		args = append(args, "-zlz4hc")
	}
	if allRoot {
		// Unprivileged extraction could not keep the image's owners; the
		// guest runs as root, so root-owned is what the image means.
		args = append(args, "--all-root")
	}
	args = append(args, out, dir)
	cmd := exec.CommandContext(ctx, bin, args...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", bin, strings.Join(args, " "), err, tail(buf.String(), 2048))
	}
	return nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func syncDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range append(entries, nil) {
		p := dir
		if e != nil {
			p = filepath.Join(dir, e.Name())
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

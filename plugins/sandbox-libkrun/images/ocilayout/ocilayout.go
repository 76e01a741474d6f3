// Package ocilayout keeps a local OCI image layout whose index.json entries
// are named by their public reference (the org.opencontainers.image.ref.name
// annotation holds e.g. "docker.io/iiidev/python:latest"). It is how images
// built on a machine without registry access are "loaded": the image store
// looks here before it asks a registry.
//
// Writes are crash-safe (blobs and index.json are written to a temporary
// file and renamed) and serialised between processes by a lock file, so a
// reader never sees a half-written index.
package ocilayout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/iii-sandbox/iii/internal/atomicfile"
)

// RefNameAnnotation names an index.json entry.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// CanonicalRef returns the one spelling of ref used as a key everywhere:
// registry host (Docker Hub as docker.io), repository, and tag or digest.
// "python" and "index.docker.io/library/python:latest" both become
// "docker.io/library/python:latest".
func CanonicalRef(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("invalid OCI reference %q: %w", ref, err)
	}
	return canonical(r), nil
}

func canonical(r name.Reference) string {
	repo := CanonicalHost(r.Context().RegistryStr()) + "/" + r.Context().RepositoryStr()
	if d, ok := r.(name.Digest); ok {
		return repo + "@" + d.DigestStr()
	}
	return repo + ":" + r.Identifier()
}

// CanonicalHost folds Docker Hub's host aliases into "docker.io".
func CanonicalHost(h string) string {
	switch h {
	case name.DefaultRegistry, "registry-1.docker.io", "docker.io":
		return "docker.io"
	}
	return h
}

// Entry is an image (or index) found in a layout.
type Entry struct {
	Ref        string
	Descriptor v1.Descriptor
	// Exactly one of Image and Index is set.
	Image v1.Image
	Index v1.ImageIndex
}

// Find returns the entry named ref in the layout at dir. A missing layout
// or a missing name is (nil, nil): absence is not an error.
func Find(dir, ref string) (*Entry, error) {
	want, err := CanonicalRef(ref)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "index.json")); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("open OCI layout %s: %w", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s index: %w", dir, err)
	}
	// The last matching entry wins, like a later `load` of the same name.
	for i := len(im.Manifests) - 1; i >= 0; i-- {
		d := im.Manifests[i]
		got, err := CanonicalRef(d.Annotations[RefNameAnnotation])
		if err != nil || got != want {
			continue
		}
		e := &Entry{Ref: want, Descriptor: d}
		switch {
		case d.MediaType.IsIndex():
			e.Index, err = idx.ImageIndex(d.Digest)
		case d.MediaType.IsImage():
			e.Image, err = idx.Image(d.Digest)
		default:
			return nil, fmt.Errorf("OCI layout %s: entry %s has media type %q, not an image", dir, want, d.MediaType)
		}
		if err != nil {
			return nil, fmt.Errorf("OCI layout %s: entry %s: %w", dir, want, err)
		}
		return e, nil
	}
	return nil, nil
}

// BlobPath is where the layout at dir keeps blob h.
func BlobPath(dir string, h v1.Hash) string {
	return filepath.Join(dir, "blobs", h.Algorithm, h.Hex)
}

// Put stores img in the layout at dir (created if needed) under ref,
// replacing any entry of the same name, and deletes blobs no entry uses
// any more. It returns the image's manifest digest.
func Put(dir, ref string, img v1.Image) (v1.Hash, error) {
	canon, err := CanonicalRef(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs"), 0o755); err != nil {
		return v1.Hash{}, err
	}
	unlock, err := lock(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	defer unlock()

	if err := atomicfile.Write(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return v1.Hash{}, err
	}
	layers, err := img.Layers()
	if err != nil {
		return v1.Hash{}, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return v1.Hash{}, err
		}
		if err := writeBlob(dir, d, func() (io.ReadCloser, error) { return l.Compressed() }); err != nil {
			return v1.Hash{}, fmt.Errorf("write layer %s: %w", d, err)
		}
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return v1.Hash{}, err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	if err := writeBlob(dir, cfgName, bytesBlob(cfg)); err != nil {
		return v1.Hash{}, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	if err := writeBlob(dir, digest, bytesBlob(raw)); err != nil {
		return v1.Hash{}, err
	}
	mt, err := img.MediaType()
	if err != nil {
		return v1.Hash{}, err
	}

	index, err := readIndex(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	kept := index.Manifests[:0]
	for _, d := range index.Manifests {
		if got, err := CanonicalRef(d.Annotations[RefNameAnnotation]); err == nil && got == canon {
			continue
		}
		kept = append(kept, d)
	}
	index.Manifests = append(kept, v1.Descriptor{
		MediaType:   mt,
		Size:        int64(len(raw)),
		Digest:      digest,
		Annotations: map[string]string{RefNameAnnotation: canon},
	})
	if err := writeIndex(dir, index); err != nil {
		return v1.Hash{}, err
	}
	return digest, gc(dir, index)
}

func bytesBlob(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

func readIndex(dir string) (*v1.IndexManifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return &v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}, nil
	}
	if err != nil {
		return nil, err
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("parse %s/index.json: %w", dir, err)
	}
	return im, nil
}

func writeIndex(dir string, im *v1.IndexManifest) error {
	b, err := json.MarshalIndent(im, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, "index.json"), b, 0o644)
}

// writeBlob stores a blob under its digest unless it is already there,
// checking the digest of what it writes.
func writeBlob(dir string, h v1.Hash, open func() (io.ReadCloser, error)) error {
	final := BlobPath(dir, h)
	if _, err := os.Stat(final); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return err
	}
	rc, err := open()
	if err != nil {
		return err
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(filepath.Dir(final), ".tmp-"+h.Hex)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	got, _, err := v1.SHA256(io.TeeReader(rc, tmp))
	if err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if got != h {
		return fmt.Errorf("blob digest mismatch: want %s, wrote %s", h, got)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), final)
}

// lock takes the layout's exclusive writer lock.
func lock(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// gc removes blobs that no index entry reaches.
func gc(dir string, im *v1.IndexManifest) error {
	keep := map[string]bool{}
	var walk func(d v1.Descriptor) error
	walk = func(d v1.Descriptor) error {
		if keep[d.Digest.String()] {
			return nil
		}
		keep[d.Digest.String()] = true
		b, err := os.ReadFile(BlobPath(dir, d.Digest))
		if err != nil {
			return err
		}
		switch {
		case d.MediaType.IsIndex():
			child, err := v1.ParseIndexManifest(bytes.NewReader(b))
			if err != nil {
				return err
			}
			for _, c := range child.Manifests {
				if err := walk(c); err != nil {
					return err
				}
			}
		case d.MediaType.IsImage():
			m, err := v1.ParseManifest(bytes.NewReader(b))
			if err != nil {
				return err
			}
			keep[m.Config.Digest.String()] = true
			for _, l := range m.Layers {
				keep[l.Digest.String()] = true
			}
		}
		return nil
	}
	for _, d := range im.Manifests {
		if err := walk(d); err != nil {
			// A layout we cannot fully read is left alone rather than
			// pruned on a guess.
			return nil
		}
	}
	algs, err := os.ReadDir(filepath.Join(dir, "blobs"))
	if err != nil {
		return err
	}
	for _, a := range algs {
		files, err := os.ReadDir(filepath.Join(dir, "blobs", a.Name()))
		if err != nil {
			return err
		}
		for _, f := range files {
			if strings.HasPrefix(f.Name(), ".tmp-") || keep[a.Name()+":"+f.Name()] {
				continue
			}
			if err := os.Remove(filepath.Join(dir, "blobs", a.Name(), f.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

package ocilayout

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"gotest.tools/v3/assert"
)

func TestCanonicalRef(t *testing.T) {
	tests := []struct{ in, want, wantErr string }{
		{in: "python", want: "docker.io/library/python:latest"},
		{in: "docker.io/iiidev/python:latest", want: "docker.io/iiidev/python:latest"},
		{in: "index.docker.io/iiidev/python", want: "docker.io/iiidev/python:latest"},
		{in: "registry-1.docker.io/iiidev/node:20", want: "docker.io/iiidev/node:20"},
		{in: "127.0.0.1:5000/a/b:c", want: "127.0.0.1:5000/a/b:c"},
		{in: "ghcr.io/o/r@sha256:" + hex64, want: "ghcr.io/o/r@sha256:" + hex64},
		{in: "Not A Ref", wantErr: "invalid OCI reference"},
		{in: "", wantErr: "invalid OCI reference"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := CanonicalRef(tc.in)
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func image(t *testing.T, content string) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), static.NewLayer([]byte(content), types.OCILayer))
	assert.NilError(t, err)
	return img
}

func TestPutFindReplace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oci")
	e, err := Find(dir, "docker.io/iiidev/python:latest")
	assert.NilError(t, err)
	assert.Assert(t, e == nil, "missing layout is not an error")

	a, b, c := image(t, "a"), image(t, "b"), image(t, "c")
	da, err := Put(dir, "iiidev/python", a)
	assert.NilError(t, err)
	_, err = Put(dir, "docker.io/iiidev/node:latest", b)
	assert.NilError(t, err)

	e, err = Find(dir, "index.docker.io/iiidev/python:latest")
	assert.NilError(t, err)
	assert.Assert(t, e != nil && e.Image != nil)
	assert.Equal(t, e.Descriptor.Digest, da)
	assert.Equal(t, e.Descriptor.Annotations[RefNameAnnotation], "docker.io/iiidev/python:latest")

	// Replacing python drops a's blobs but keeps node's.
	dc, err := Put(dir, "docker.io/iiidev/python:latest", c)
	assert.NilError(t, err)
	e, err = Find(dir, "docker.io/iiidev/python:latest")
	assert.NilError(t, err)
	assert.Equal(t, e.Descriptor.Digest, dc)
	_, err = os.Stat(BlobPath(dir, da))
	assert.Assert(t, errors.Is(err, fs.ErrNotExist))
	e, err = Find(dir, "docker.io/iiidev/node:latest")
	assert.NilError(t, err)
	layers, err := e.Image.Layers()
	assert.NilError(t, err)
	rc, err := layers[0].Compressed()
	assert.NilError(t, err)
	var buf bytes.Buffer
	_, err = buf.ReadFrom(rc)
	assert.NilError(t, err)
	assert.Equal(t, buf.String(), "b")

	idx, err := readIndex(dir)
	assert.NilError(t, err)
	assert.Equal(t, len(idx.Manifests), 2)
	e, err = Find(dir, "docker.io/iiidev/ruby:latest")
	assert.NilError(t, err)
	assert.Assert(t, e == nil)
}

// FuzzFind reads arbitrary index.json bytes: Find may fail, never panic.
func FuzzFind(f *testing.F) {
	f.Add([]byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:` + hex64 + `","size":1,"annotations":{"org.opencontainers.image.ref.name":"docker.io/iiidev/python:latest"}}]}`))
	f.Add([]byte(`{"manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:` + hex64 + `","annotations":{"org.opencontainers.image.ref.name":"python"}}]}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, index []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "index.json"), index, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _ = Find(dir, "docker.io/iiidev/python:latest")
	})
}

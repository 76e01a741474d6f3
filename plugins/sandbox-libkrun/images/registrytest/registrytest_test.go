package registrytest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"go.uber.org/goleak"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

func TestRegistry(t *testing.T) {
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), static.NewLayer([]byte("layer"), types.OCILayer))
	assert.NilError(t, err)
	want, err := img.Digest()
	assert.NilError(t, err)

	tests := []struct {
		name string
		opts Options
	}{
		{name: "anonymous", opts: Options{}},
		{name: "basic", opts: Options{Auth: AuthBasic, Username: "u", Password: "p"}},
		{name: "token", opts: Options{Auth: AuthToken, Username: "u", Password: "p"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			reg, err := Start(tc.opts)
			assert.NilError(t, err)
			defer reg.Close()
			ref, err := reg.Push(ctx, "a/b:1", img)
			assert.NilError(t, err)
			r, err := name.ParseReference(ref)
			assert.NilError(t, err)

			desc, err := remote.Get(r, remote.WithContext(ctx), remote.WithAuth(reg.Authenticator()))
			assert.NilError(t, err)
			assert.Equal(t, desc.Digest, want)
			assert.Assert(t, reg.Requests("manifest GET") >= 1)
			if tc.opts.Auth == AuthToken {
				assert.Assert(t, reg.Requests("token GET") >= 1)
			}
			if tc.opts.Auth != AuthNone {
				_, err = remote.Get(r, remote.WithContext(ctx), remote.WithAuth(authn.Anonymous))
				assert.ErrorContains(t, err, "UNAUTHORIZED")
			}
		})
	}
}

func TestPushLayout(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "oci")
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), static.NewLayer([]byte("x"), types.OCILayer))
	assert.NilError(t, err)
	_, err = ocilayout.Put(dir, "docker.io/iiidev/python:latest", img)
	assert.NilError(t, err)
	reg, err := Start(Options{})
	assert.NilError(t, err)
	defer reg.Close()
	got, err := reg.PushLayout(ctx, dir, "docker.io/iiidev/python:latest")
	assert.NilError(t, err)
	assert.Equal(t, got, reg.Host()+"/iiidev/python:latest")
	_, err = reg.PushLayout(ctx, dir, "docker.io/iiidev/node:latest")
	assert.ErrorContains(t, err, "run scripts/build-images.sh")
	_, err = Start(Options{Auth: AuthBasic})
	assert.ErrorContains(t, err, "needs a username")
}

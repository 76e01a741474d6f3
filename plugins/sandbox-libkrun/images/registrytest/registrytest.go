// Package registrytest runs a real OCI distribution registry in process,
// on a loopback port, for tests and benchmarks: go-containerregistry's
// registry behind an optional Basic or token (Bearer) authentication layer
// and an optional fault hook. Images get in through the registry protocol
// itself (Push, PushLayout), so a client that pulls from it exercises the
// same requests as against a public registry.
package registrytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

// Auth selects how clients must authenticate.
type Auth int

const (
	AuthNone Auth = iota
	// AuthBasic: HTTP Basic on every /v2/ request.
	AuthBasic
	// AuthToken: the Docker token flow: 401 with a Bearer challenge, a
	// token endpoint that takes Basic credentials, then Bearer requests.
	AuthToken
)

// Options configure a registry.
type Options struct {
	Auth     Auth
	Username string
	Password string
	// Hook runs before the registry handles a request; returning true
	// means the hook wrote the response (fault injection).
	Hook func(w http.ResponseWriter, r *http.Request) bool
}

// Registry is a running registry. Close it when done.
type Registry struct {
	srv   *httptest.Server
	opts  Options
	token string

	mu       sync.Mutex
	requests map[string]int
}

// Start serves a new, empty registry on 127.0.0.1.
func Start(opts Options) (*Registry, error) {
	if opts.Auth != AuthNone && (opts.Username == "" || opts.Password == "") {
		return nil, errors.New("registrytest: authentication needs a username and a password")
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	r := &Registry{opts: opts, token: hex.EncodeToString(tok), requests: map[string]int{}}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.count(req)
		if req.URL.Path == "/token" {
			r.serveToken(w, req)
			return
		}
		if !r.authorized(w, req) {
			return
		}
		if h := r.opts.Hook; h != nil && h(w, req) {
			return
		}
		inner.ServeHTTP(w, req)
	}))
	return r, nil
}

// Close stops the server.
func (r *Registry) Close() { r.srv.Close() }

// Host is "127.0.0.1:<port>", the registry part of references.
func (r *Registry) Host() string { return strings.TrimPrefix(r.srv.URL, "http://") }

// URL is the base URL, e.g. for a registry mirror setting.
func (r *Registry) URL() string { return r.srv.URL }

// Authenticator returns the credentials clients need (anonymous without auth).
func (r *Registry) Authenticator() authn.Authenticator {
	if r.opts.Auth == AuthNone {
		return authn.Anonymous
	}
	return &authn.Basic{Username: r.opts.Username, Password: r.opts.Password}
}

// Requests returns how many requests of a kind arrived: kinds are
// "manifest GET", "blob GET", "manifest HEAD", "token", etc.
func (r *Registry) Requests(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[kind]
}

// ResetRequests clears the counters.
func (r *Registry) ResetRequests() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = map[string]int{}
}

func (r *Registry) count(req *http.Request) {
	kind := "other"
	switch {
	case req.URL.Path == "/token":
		kind = "token"
	case strings.Contains(req.URL.Path, "/manifests/"):
		kind = "manifest"
	case strings.Contains(req.URL.Path, "/blobs/uploads"):
		kind = "upload"
	case strings.Contains(req.URL.Path, "/blobs/"):
		kind = "blob"
	}
	r.mu.Lock()
	r.requests[kind+" "+req.Method]++
	r.mu.Unlock()
}

func (r *Registry) checkBasic(req *http.Request) bool {
	u, p, ok := req.BasicAuth()
	return ok && u == r.opts.Username && p == r.opts.Password
}

func (r *Registry) authorized(w http.ResponseWriter, req *http.Request) bool {
	switch r.opts.Auth {
	case AuthBasic:
		if r.checkBasic(req) {
			return true
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="registrytest"`)
	case AuthToken:
		if req.Header.Get("Authorization") == "Bearer "+r.token {
			return true
		}
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service="registrytest"`, r.srv.URL+"/token"))
	default:
		return true
	}
	writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
	return false
}

func (r *Registry) serveToken(w http.ResponseWriter, req *http.Request) {
	if r.opts.Auth != AuthToken {
		http.NotFound(w, req)
		return
	}
	if !r.checkBasic(req) {
		w.Header().Set("WWW-Authenticate", `Basic realm="registrytest"`)
		writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "bad credentials")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"token": r.token, "access_token": r.token, "expires_in": 300})
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
}

// Ref returns the reference of repo:tag ("iiidev/python:latest") here.
func (r *Registry) Ref(repoTag string) string { return r.Host() + "/" + repoTag }

func (r *Registry) remoteOpts(ctx context.Context) []remote.Option {
	return []remote.Option{remote.WithContext(ctx), remote.WithAuth(r.Authenticator())}
}

// Push uploads img as repoTag ("iiidev/python:latest") through the
// registry protocol and returns the full reference.
func (r *Registry) Push(ctx context.Context, repoTag string, img v1.Image) (string, error) {
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, r.remoteOpts(ctx)...); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref.String(), nil
}

// PushIndex uploads a multi-platform index as repoTag.
func (r *Registry) PushIndex(ctx context.Context, repoTag string, idx v1.ImageIndex) (string, error) {
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(ref, idx, r.remoteOpts(ctx)...); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref.String(), nil
}

// PushLayout uploads the entry named ref (e.g. "docker.io/iiidev/python:latest")
// of the local OCI layout at dir under the same repository and tag here,
// and returns the reference it has in this registry.
func (r *Registry) PushLayout(ctx context.Context, dir, ref string) (string, error) {
	e, err := ocilayout.Find(dir, ref)
	if err != nil {
		return "", err
	}
	if e == nil {
		return "", fmt.Errorf("%s is not in the OCI layout %s (run scripts/build-images.sh)", ref, dir)
	}
	parsed, err := name.ParseReference(e.Ref)
	if err != nil {
		return "", err
	}
	repoTag := parsed.Context().RepositoryStr() + ":" + parsed.Identifier()
	if d, ok := parsed.(name.Digest); ok {
		repoTag = parsed.Context().RepositoryStr() + "@" + d.DigestStr()
	}
	if e.Index != nil {
		return r.PushIndex(ctx, repoTag, e.Index)
	}
	return r.Push(ctx, repoTag, e.Image)
}

package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/iii-sandbox/iii/compose"
)

// Environment and layout of the default registry.
const (
	// EnvRegistry overrides the default registry: an http(s):// base URL
	// or a local directory.
	EnvRegistry = "III_REGISTRY"
	// EmbeddedDir is the default registry's directory beside the running
	// iii binary (`make build` publishes bin/registry).
	EmbeddedDir = "registry"
	// IndexTimeout bounds fetching one index.json.
	IndexTimeout = 60 * time.Second
)

// Location is a registry: an HTTP(S) base URL, or a local directory that
// holds the same files. Either way a package's index is
// <registry>/packages/<name>/index.json.
type Location struct {
	base *url.URL // http or https, path ending in "/"; nil for a directory
	dir  string   // absolute directory; "" for HTTP
	// origin says where the location came from, for messages
	// ("$III_REGISTRY", "the registry beside iii", a host).
	origin string
}

// ParseLocation reads a registry given as an http(s):// URL or a directory
// (made absolute against the working directory).
func ParseLocation(s string) (Location, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Location{}, compose.New(compose.CodeRegistryUnreachable, "the registry location is empty; give an http(s):// URL or a directory")
	}
	if strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			return Location{}, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("registry URL %q is not a valid http(s) URL", clip(s, 120)))
		}
		u.RawQuery, u.Fragment = "", ""
		if !strings.HasSuffix(u.Path, "/") {
			u.Path += "/"
		}
		return Location{base: u, origin: u.String()}, nil
	}
	if strings.Contains(s, "://") {
		return Location{}, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("registry %q: only http://, https:// and local directories are registries", clip(s, 120)))
	}
	abs, err := filepath.Abs(s)
	if err != nil {
		return Location{}, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("registry directory %s: %v", s, err))
	}
	return Location{dir: abs, origin: abs}, nil
}

// HostLocation is the registry of package://<host>/<name>: https://<host>/,
// or http:// for a loopback host (a registry on this machine, as tests
// run one).
func HostLocation(host string) (Location, error) {
	scheme := "https"
	if IsLoopback(host) {
		scheme = "http"
	}
	l, err := ParseLocation(scheme + "://" + host + "/")
	if err != nil {
		return Location{}, err
	}
	l.origin = host
	return l, nil
}

// IsLoopback reports whether host (with an optional :port) names this
// machine.
func IsLoopback(host string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	}
	h = strings.Trim(h, "[]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// DefaultLocation is the registry of package://<name>: $III_REGISTRY, else
// the directory registry/ beside the running iii (resolved through
// symlinks, so a linked iii finds its own registry).
func DefaultLocation(getenv func(string) string, executable func() (string, error)) (Location, error) {
	if v := strings.TrimSpace(getenv(EnvRegistry)); v != "" {
		l, err := ParseLocation(v)
		if err != nil {
			return Location{}, err
		}
		l.origin = "$" + EnvRegistry + " (" + l.String() + ")"
		return l, nil
	}
	exe, err := executable()
	if err != nil {
		return Location{}, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf(
			"cannot find the registry beside iii (%v); set $%s to a registry URL or directory", err, EnvRegistry))
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	dir := filepath.Join(filepath.Dir(exe), EmbeddedDir)
	return Location{dir: dir, origin: "the registry beside iii (" + dir + ")"}, nil
}

// String is the registry's URL or directory.
func (l Location) String() string {
	if l.base != nil {
		return l.base.String()
	}
	return l.dir
}

// Describe names the registry in messages, with where it came from.
func (l Location) Describe() string {
	if l.origin != "" && l.origin != l.String() {
		return "registry " + l.origin
	}
	return "registry " + l.String()
}

// IsDir reports whether the registry is a local directory.
func (l Location) IsDir() bool { return l.base == nil }

// Zero reports whether l was never set.
func (l Location) Zero() bool { return l.base == nil && l.dir == "" }

// indexLocation is where a package's index.json is: a URL or a path.
func (l Location) indexLocation(name string) string {
	if l.base != nil {
		return l.base.ResolveReference(&url.URL{Path: "packages/" + name + "/index.json"}).String()
	}
	return filepath.Join(l.dir, "packages", name, "index.json")
}

// ArtifactURL turns an artefact's url as the index (or the lock) writes it
// into one to fetch: an absolute http(s) URL stays; a relative one is
// resolved against the package's index.json. file:// URLs, and paths in a
// directory registry, stay inside a directory registry.
func (l Location) ArtifactURL(name, ref string) (string, error) {
	bad := func(why string) error {
		return compose.New(compose.CodePackageDownloadFailed, fmt.Sprintf("artefact url %q of %s in %s: %s", clip(ref, 160), name, l.Describe(), why))
	}
	if !PathSafe(name) {
		return "", bad("the package name is not path-safe")
	}
	u, err := url.Parse(ref)
	if err != nil || ref == "" {
		return "", bad("not a URL")
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return "", bad("no host")
		}
		return u.String(), nil
	case "file":
		if !l.IsDir() {
			return "", bad("a registry served over HTTP may not point at local files")
		}
		if !l.inside(u.Path) {
			return "", bad("it points outside the registry directory " + l.dir)
		}
		return u.String(), nil
	case "":
		if u.Host != "" || strings.HasPrefix(u.Path, "/") {
			return "", bad("a relative url must be a path relative to the index")
		}
		if l.base != nil {
			return l.base.ResolveReference(&url.URL{Path: "packages/" + name + "/"}).ResolveReference(u).String(), nil
		}
		p := filepath.Join(l.dir, "packages", name, filepath.FromSlash(path.Clean(u.Path)))
		if !l.inside(p) {
			return "", bad("it points outside the registry directory " + l.dir)
		}
		return (&url.URL{Scheme: "file", Path: filepath.ToSlash(p)}).String(), nil
	}
	return "", bad("only http, https and (for a directory registry) file URLs are fetched")
}

func (l Location) inside(p string) bool {
	rel, err := filepath.Rel(l.dir, filepath.FromSlash(p))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// Client reads registries.
type Client struct {
	// HTTP fetches from HTTP(S) registries; nil means a client with
	// default transport settings (calls are bounded by their contexts).
	HTTP *http.Client

	// protos remembers what each HTTP registry was found to speak, for
	// the client's life (resolver.go).
	mu     sync.Mutex
	protos map[string]Protocol
}

func (c *Client) http() *http.Client {
	if c != nil && c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{}
}

// Index fetches and decodes the index of package name. A registry that
// cannot be read is REGISTRY_UNREACHABLE; a package it does not have is
// PACKAGE_NOT_RESOLVED.
func (c *Client) Index(ctx context.Context, loc Location, name string) (*Index, error) {
	if !PathSafe(name) {
		return nil, compose.New(compose.CodePackageNotResolved, fmt.Sprintf("%q is not a package name", clip(name, 80)))
	}
	where := loc.indexLocation(name)
	var data []byte
	var err error
	if loc.IsDir() {
		data, err = readIndexFile(loc, name, where)
	} else {
		data, err = c.fetchIndex(ctx, loc, name, where)
	}
	if err != nil {
		return nil, err
	}
	return DecodeIndex(data, name, where)
}

func readIndexFile(loc Location, name, where string) ([]byte, error) {
	st, err := os.Stat(loc.dir)
	if err != nil || !st.IsDir() {
		return nil, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf(
			"%s is not a directory (%s); set $%s to a registry URL or directory, or build iii with `make build`, which publishes bin/%s",
			loc.Describe(), errText(err, "not a directory"), EnvRegistry, EmbeddedDir))
	}
	f, err := os.Open(where)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notInRegistry(loc, name)
	}
	if err != nil {
		return nil, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("%s: cannot read %s: %v", loc.Describe(), where, err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxIndexSize+1))
	if err != nil {
		return nil, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("%s: cannot read %s: %v", loc.Describe(), where, err))
	}
	return data, nil
}

// registryError is the error body an HTTP registry may send.
type registryError struct {
	Error struct {
		Message string `json:"message"`
		Fix     string `json:"fix"`
	} `json:"error"`
}

func (c *Client) fetchIndex(ctx context.Context, loc Location, name, where string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, IndexTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, where, nil)
	if err != nil {
		return nil, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("%s: %v", loc.Describe(), err))
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("%s cannot be reached: %v", loc.Describe(), unwrapURLError(err)))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxIndexSize+1))
	if err != nil {
		return nil, compose.New(compose.CodeRegistryUnreachable, fmt.Sprintf("%s: reading %s failed: %v", loc.Describe(), where, unwrapURLError(err)))
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return data, nil
	case resp.StatusCode == http.StatusNotFound:
		return nil, indexNotServed{notInRegistry(loc, name)}
	default:
		msg := fmt.Sprintf("%s answered %s for %s", loc.Describe(), resp.Status, where)
		var re registryError
		if json.Unmarshal(data, &re) == nil && re.Error.Message != "" {
			msg += ": " + clip(re.Error.Message, 300)
			if re.Error.Fix != "" {
				msg += " (" + clip(re.Error.Fix, 300) + ")"
			}
		}
		err := compose.New(compose.CodeRegistryUnreachable, msg)
		if resp.StatusCode == http.StatusMethodNotAllowed || resp.StatusCode == http.StatusNotImplemented {
			return nil, indexNotServed{err}
		}
		return nil, err
	}
}

// indexNotServed marks an HTTP registry that has no index.json for a
// package (404) or serves no GETs there (405, 501): it may speak
// upstream's protocol instead (resolver.go).
type indexNotServed struct{ err error }

func (e indexNotServed) Error() string { return e.err.Error() }
func (e indexNotServed) Unwrap() error { return e.err }

func notInRegistry(loc Location, name string) error {
	return compose.New(compose.CodePackageNotResolved, fmt.Sprintf("%s has no package %q; check the name in worker: (package://<name> or package://<registry-host>/<name>)",
		loc.Describe(), name))
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func errText(err error, otherwise string) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	if err != nil {
		return err.Error()
	}
	return otherwise
}

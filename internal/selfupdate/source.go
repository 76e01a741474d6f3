package selfupdate

import (
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"strings"

	"github.com/iii-sandbox/iii/compose/registry"
)

// Source is where releases are read: an HTTP(S) base URL, or a local
// directory (given as a path or a file:// URL). Either way the index is
// <source>/index.json.
type Source struct {
	base *url.URL // http or https, path ending in "/"; nil for a directory
	dir  string   // absolute; "" for HTTP
	// origin says where the source came from, for messages.
	origin string
}

// ParseSource reads a source: http://, https://, file:// or a directory
// (made absolute against the working directory).
func ParseSource(s string) (Source, error) {
	s = strings.TrimSpace(s)
	bad := func(why string) error {
		return newError(CodeInvalidSource, fmt.Sprintf("release source %q: %s; give an http(s):// URL, a file:// URL or a directory", clip(s, 160), why))
	}
	if s == "" {
		return Source{}, bad("it is empty")
	}
	if i := strings.Index(s, "://"); i > 0 {
		u, err := url.Parse(s)
		if err != nil {
			return Source{}, bad("not a valid URL")
		}
		switch strings.ToLower(u.Scheme) {
		case "http", "https":
			if u.Host == "" {
				return Source{}, bad("the URL has no host")
			}
			if u.User != nil {
				return Source{}, bad("credentials in the URL are not sent")
			}
			u.Scheme = strings.ToLower(u.Scheme)
			u.RawQuery, u.Fragment = "", ""
			if !strings.HasSuffix(u.Path, "/") {
				u.Path += "/"
			}
			u.RawPath = ""
			return Source{base: u}, nil
		case "file":
			if u.Host != "" && u.Host != "localhost" {
				return Source{}, bad("a file:// URL names a directory on this machine (file:///path)")
			}
			if u.Path == "" {
				return Source{}, bad("the file:// URL has no path")
			}
			return dirSource(filepath.FromSlash(u.Path))
		}
		return Source{}, bad("only http, https and file URLs are release sources")
	}
	return dirSource(s)
}

func dirSource(p string) (Source, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return Source{}, newError(CodeInvalidSource, fmt.Sprintf("release source directory %s: %v", p, err))
	}
	return Source{dir: abs}, nil
}

// ResolveSource picks the source: the flag when given, else $III_RELEASE_SOURCE,
// else DefaultSource.
func ResolveSource(flag string, getenv func(string) string) (Source, error) {
	if strings.TrimSpace(flag) != "" {
		s, err := ParseSource(flag)
		if err == nil {
			s.origin = "--source"
		}
		return s, err
	}
	if v := strings.TrimSpace(getenv(EnvSource)); v != "" {
		s, err := ParseSource(v)
		if err == nil {
			s.origin = "$" + EnvSource
		}
		return s, err
	}
	s, err := ParseSource(DefaultSource)
	if err == nil {
		s.origin = "the default release source"
	}
	return s, err
}

// String is the source's URL or directory.
func (s Source) String() string {
	if s.base != nil {
		return strings.TrimSuffix(s.base.String(), "/")
	}
	return s.dir
}

// Describe names the source in messages, with where it came from.
func (s Source) Describe() string {
	if s.origin != "" {
		return "release source " + s.String() + " (" + s.origin + ")"
	}
	return "release source " + s.String()
}

// Origin says where the source was set: --source, $III_RELEASE_SOURCE or
// the default.
func (s Source) Origin() string { return s.origin }

// IsDir reports a local directory source.
func (s Source) IsDir() bool { return s.base == nil }

// Insecure reports a plain-HTTP source on another machine: its digests
// travel unprotected, so the command warns.
func (s Source) Insecure() bool {
	return s.base != nil && s.base.Scheme == "http" && !registry.IsLoopback(s.base.Host)
}

// IndexLocation is the URL or path of index.json.
func (s Source) IndexLocation() string {
	if s.base != nil {
		return s.base.ResolveReference(&url.URL{Path: IndexFile}).String()
	}
	return filepath.Join(s.dir, IndexFile)
}

// AssetURL turns an asset's url as the index writes it into one to fetch:
// an absolute http(s) URL stays; a relative one is resolved against
// index.json. A directory source may also use file:// URLs and relative
// paths, both inside its directory; an HTTP source may not point at local
// files.
func (s Source) AssetURL(ref string) (string, error) {
	bad := func(why string) error {
		return newError(CodeIndexInvalid, fmt.Sprintf("asset url %q in %s: %s", clip(ref, 160), s.IndexLocation(), why))
	}
	u, err := url.Parse(strings.TrimSpace(ref))
	if err != nil || ref == "" {
		return "", bad("not a URL")
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
		if u.Host == "" {
			return "", bad("no host")
		}
		return u.String(), nil
	case "file":
		if !s.IsDir() {
			return "", bad("a source served over HTTP may not point at local files")
		}
		if !s.inside(filepath.FromSlash(u.Path)) {
			return "", bad("it points outside the source directory " + s.dir)
		}
		return (&url.URL{Scheme: "file", Path: u.Path}).String(), nil
	case "":
		if u.Host != "" || strings.HasPrefix(u.Path, "/") || u.Path == "" {
			return "", bad("a relative url must be a path relative to index.json")
		}
		if s.base != nil {
			return s.base.ResolveReference(u).String(), nil
		}
		p := filepath.Join(s.dir, filepath.FromSlash(path.Clean(u.Path)))
		if !s.inside(p) {
			return "", bad("it points outside the source directory " + s.dir)
		}
		return (&url.URL{Scheme: "file", Path: filepath.ToSlash(p)}).String(), nil
	}
	return "", bad("only http, https and (for a directory source) file URLs are fetched")
}

func (s Source) inside(p string) bool {
	rel, err := filepath.Rel(s.dir, filepath.Clean(p))
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

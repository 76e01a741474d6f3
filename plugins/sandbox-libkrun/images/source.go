package images

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

// source is an image ready to be installed.
type source struct {
	kind   string // "local" or "registry"
	digest v1.Hash
	img    v1.Image
	// layout is set for local images: their blobs are read in place.
	layout   string
	platform string
}

func (s *Store) findLocal(canon string) (*source, error) {
	for _, dir := range s.opts.LocalLayouts {
		e, err := ocilayout.Find(dir, canon)
		if err != nil {
			return nil, err
		}
		if e == nil {
			continue
		}
		src := &source{kind: "local", layout: dir}
		if e.Index != nil {
			img, d, err := pickPlatform(e.Index, *s.opts.Platform)
			if err != nil {
				return nil, fmt.Errorf("local image %s: %w", canon, err)
			}
			src.img, src.digest = img, d
		} else {
			src.img, src.digest = e.Image, e.Descriptor.Digest
		}
		if err := s.checkPlatform(src); err != nil {
			return nil, fmt.Errorf("local image %s: %w", canon, err)
		}
		return src, nil
	}
	return nil, nil
}

func (s *Store) resolveRemote(ctx context.Context, canon string) (*source, error) {
	ref, err := s.remoteRef(canon)
	if err != nil {
		return nil, err
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(authn.NewMultiKeychain(credKeychain(s.opts.Credentials), s.opts.Keychain)),
		remote.WithPlatform(*s.opts.Platform),
		remote.WithUserAgent("iii-sandbox-libkrun"),
		// Short: the caller sees S102 (retryable) and decides how long to wait.
		remote.WithRetryBackoff(remote.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}),
	}
	if s.opts.Transport != nil {
		opts = append(opts, remote.WithTransport(s.opts.Transport))
	}
	desc, err := remote.Get(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("fetch manifest of %s: %w", ref, err)
	}
	src := &source{kind: "registry"}
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, err
		}
		img, d, err := pickPlatform(idx, *s.opts.Platform)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
		src.img, src.digest = img, d
	} else {
		img, err := desc.Image()
		if err != nil {
			return nil, err
		}
		src.img, src.digest = img, desc.Digest
	}
	if err := s.checkPlatform(src); err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return src, nil
}

// pickPlatform selects the manifest for p from an index.
func pickPlatform(idx v1.ImageIndex, p v1.Platform) (v1.Image, v1.Hash, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, err
	}
	var seen []string
	for _, d := range im.Manifests {
		if !d.MediaType.IsImage() {
			continue
		}
		if d.Platform == nil {
			seen = append(seen, "unknown")
			continue
		}
		seen = append(seen, d.Platform.String())
		if d.Platform.OS != p.OS || d.Platform.Architecture != p.Architecture {
			continue
		}
		if p.Variant != "" && d.Platform.Variant != "" && d.Platform.Variant != p.Variant {
			continue
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, v1.Hash{}, err
		}
		return img, d.Digest, nil
	}
	return nil, v1.Hash{}, fmt.Errorf("%w %s (the index has: %s)", errNoPlatform, p.String(), strings.Join(seen, ", "))
}

// checkPlatform refuses a single-platform image built for another
// platform, which would only fail later inside the VM.
func (s *Store) checkPlatform(src *source) error {
	// The manifest's own caps first: the config is fetched next.
	m, err := src.img.Manifest()
	if err != nil {
		return fmt.Errorf("read manifest: %w", err)
	}
	if err := s.checkManifest(m); err != nil {
		return err
	}
	cf, err := src.img.ConfigFile()
	if err != nil {
		return fmt.Errorf("read image config: %w", err)
	}
	want := s.opts.Platform
	if cf.OS != "" && cf.Architecture != "" && (cf.OS != want.OS || cf.Architecture != want.Architecture) {
		return fmt.Errorf("image is for %s/%s, this host needs %s", cf.OS, cf.Architecture, want.String())
	}
	src.platform = want.String()
	return nil
}

// mirror is a parsed Mirrors entry.
type mirror struct {
	host     string
	insecure bool
}

func parseMirrors(m map[string]string, insecure bool) (map[string]mirror, error) {
	out := map[string]mirror{}
	for host, base := range m {
		u, err := url.Parse(base)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("registry_mirrors.%s: %q is not an http(s) base URL", host, base)
		}
		if p := strings.Trim(u.Path, "/"); p != "" || u.RawQuery != "" || u.User != nil {
			return nil, fmt.Errorf("registry_mirrors.%s: %q must be scheme://host[:port] only", host, base)
		}
		if u.Scheme == "http" && !insecure && !isLoopback(u.Hostname()) {
			return nil, fmt.Errorf("registry_mirrors.%s: plain http to %s needs insecure: true (only loopback is allowed without it)", host, u.Host)
		}
		out[ocilayout.CanonicalHost(host)] = mirror{host: u.Host, insecure: u.Scheme == "http"}
	}
	return out, nil
}

func isLoopback(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// remoteRef applies the mirrors to canon and returns what to fetch.
func (s *Store) remoteRef(canon string) (name.Reference, error) {
	mirrors, err := parseMirrors(s.opts.Mirrors, s.opts.Insecure)
	if err != nil {
		return nil, err
	}
	r, err := name.ParseReference(canon)
	if err != nil {
		return nil, err
	}
	host := ocilayout.CanonicalHost(r.Context().RegistryStr())
	var nopts []name.Option
	if m, ok := mirrors[host]; ok {
		host = m.host
		if m.insecure {
			nopts = append(nopts, name.Insecure)
		}
	} else if s.opts.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	id := ":" + r.Identifier()
	if d, ok := r.(name.Digest); ok {
		id = "@" + d.DigestStr()
	}
	return name.ParseReference(host+"/"+r.Context().RepositoryStr()+id, nopts...)
}

// credKeychain serves the explicit credentials of Options.Credentials.
type credKeychain map[string]Credential

func (k credKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	c, ok := k[r.RegistryStr()]
	if !ok {
		c, ok = k[ocilayout.CanonicalHost(r.RegistryStr())]
	}
	if !ok {
		return authn.Anonymous, nil
	}
	switch {
	case c.Username != "":
		return authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password, IdentityToken: c.Token}), nil
	case c.Token != "":
		return &authn.Bearer{Token: c.Token}, nil
	}
	return authn.Anonymous, nil
}

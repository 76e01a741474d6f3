package main

import (
	"archive/tar"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/iii-sandbox/iii/internal/tarextract"
)

// NPMPackage is a package of the npm registry unpacked into an image:
// how the node image gets an upstream Node build (Debian's is 18, built
// without the startup snapshot, and has no compile cache) and the npm
// that goes with it.
type NPMPackage struct {
	// Spec is name@version, an exact version: the image must not change
	// when the registry publishes a new one.
	Spec string
	// Integrity is the tarball's subresource integrity (sha512-<base64>),
	// as the registry's dist.integrity gives it; a download that does not
	// match fails the build.
	Integrity string
	// Dest is where the package's contents go in the image when Files is
	// empty.
	Dest string `json:",omitempty"`
	// Files maps paths inside the package to paths in the image: only
	// these are unpacked.
	Files map[string]string `json:",omitempty"`
}

// tarballName is the file npm pack writes for a spec (scope dropped,
// "/" turned to "-").
func (p NPMPackage) tarballName() (string, error) {
	at := strings.LastIndex(p.Spec, "@")
	if at <= 0 {
		return "", fmt.Errorf("npm package %q: want name@version", p.Spec)
	}
	name, version := p.Spec[:at], p.Spec[at+1:]
	name = strings.TrimPrefix(name, "@")
	name = strings.ReplaceAll(name, "/", "-")
	if version == "" || strings.ContainsAny(version, "/\\ ") || strings.ContainsAny(name, "\\ ") {
		return "", fmt.Errorf("npm package %q: want name@version", p.Spec)
	}
	return name + "-" + version + ".tgz", nil
}

// checkIntegrity tells whether file's sha512 is the one integrity names.
func checkIntegrity(file, integrity string) error {
	want, ok := strings.CutPrefix(integrity, "sha512-")
	if !ok {
		return fmt.Errorf("integrity %q: only sha512 is accepted", integrity)
	}
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha512.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := base64.StdEncoding.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s: sha512-%s, the recipe pins sha512-%s", filepath.Base(file), got, want)
	}
	return nil
}

// fetchNPM returns the package's tarball from dir, downloading it with
// `npm pack` (the registry npm is configured with, its proxy and its
// credentials) when dir does not hold a copy that matches its integrity.
func fetchNPM(ctx context.Context, dir string, p NPMPackage, logf func(string, ...any)) (string, error) {
	name, err := p.tarballName()
	if err != nil {
		return "", err
	}
	file := filepath.Join(dir, name)
	if checkIntegrity(file, p.Integrity) == nil {
		return file, nil
	}
	if _, err := exec.LookPath("npm"); err != nil {
		return "", fmt.Errorf("fetch %s: npm is needed on this machine to download it (apt-get install npm): %w", p.Spec, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	scratch, err := os.MkdirTemp(dir, "pack-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scratch)
	logf("fetching %s with npm pack", p.Spec)
	cmd := exec.CommandContext(ctx, "npm", "pack", p.Spec, "--silent", "--pack-destination", scratch)
	cmd.Dir = scratch
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm pack %s: %v: %s", p.Spec, err, lastLines(out, 10))
	}
	got := filepath.Join(scratch, name)
	if err := checkIntegrity(got, p.Integrity); err != nil {
		return "", fmt.Errorf("npm pack %s: %w", p.Spec, err)
	}
	return file, os.Rename(got, file)
}

// unpackNPM writes the package's files into root. Entries are regular
// files and directories under package/; anything else (links, devices,
// paths leaving the package) is refused, so a tarball cannot write
// outside the place the recipe gives it; and every write goes through an
// os.Root of the image's root, as internal/tarextract's do, so a link the
// Debian packages left cannot lead one out either.
func unpackNPM(tgz, rootDir string, p NPMPackage) error {
	f, err := os.Open(tgz)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := tarextract.Decompress(f)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(tgz), err)
	}
	defer zr.Close()
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(zr)
	wanted := map[string]bool{}
	for from := range p.Files {
		wanted[from] = false
	}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Base(tgz), err)
		}
		rel, ok := strings.CutPrefix(path.Clean(hdr.Name), "package/")
		if !ok || !filepath.IsLocal(rel) {
			return fmt.Errorf("%s: entry %q is not inside package/", filepath.Base(tgz), hdr.Name)
		}
		var dest string
		if len(p.Files) > 0 {
			to, keep := p.Files[rel]
			if !keep {
				continue
			}
			wanted[rel] = true
			dest = to
		} else {
			dest = path.Join(p.Dest, rel)
		}
		if !filepath.IsLocal(dest) {
			return fmt.Errorf("%s: destination %q is not inside the image", p.Spec, dest)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(dest, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := writeFileFrom(root, dest, tr, fs.FileMode(hdr.Mode)&0o755|0o644); err != nil {
				return fmt.Errorf("%s: %s: %w", p.Spec, rel, err)
			}
		default:
			return fmt.Errorf("%s: entry %q is not a file or a directory", filepath.Base(tgz), hdr.Name)
		}
	}
	for from, found := range wanted {
		if !found {
			return fmt.Errorf("%s has no %s", p.Spec, from)
		}
	}
	return nil
}

func writeFileFrom(root *os.Root, name string, r io.Reader, mode fs.FileMode) error {
	if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	out, err := root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	// The umask must not narrow what the package grants (npm's scripts
	// are executable).
	return root.Chmod(name, mode)
}

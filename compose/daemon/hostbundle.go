package daemon

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/proc"
)

// Host bundles: a registry bundle with runtime: host runs as a host
// process from a private, owner-only copy of the installed bundle, the
// workspace host/<container>/workspace/ in the project's state directory
// (directories 0700, files 0600, or 0700 when the bundle ships them
// executable). Order: pre_run → scripts.install from the manifest (only
// when the workspace is stale) → scripts.run (compose file), else
// scripts.start (manifest) → readiness → post_run at its exit. The
// installed cache entry is never written to.

// hostBundleStamp records which installed bundle the workspace was
// prepared from; a workspace whose stamp differs (another version, a
// reinstalled entry) or is missing is stale and prepared afresh.
const hostBundleStamp = "prepared"

// hostBundle is a prepared workspace.
type hostBundle struct {
	dir     string // the workspace
	command string // the start command
	install string // scripts.install, to run when stale
	stale   bool
	stamp   string // written once the preparation succeeded
	stampAt string
}

// prepareHostBundle copies the installed bundle into the container's
// workspace unless the workspace was prepared from this very bundle.
func (p *project) prepareHostBundle(key, run string, pi *pkgInfo) (*hostBundle, error) {
	base := filepath.Join(p.store.Dir(), "host", key)
	hb := &hostBundle{dir: filepath.Join(base, "workspace"), stampAt: filepath.Join(base, hostBundleStamp)}
	sha := ""
	if a, ok := pi.entry.Resolved.Artifacts[pi.target]; ok {
		sha = a.SHA256
	}
	hb.stamp = fmt.Sprintf("%s %s %s %s\n", pi.entry.Resolved.Name, pi.entry.Resolved.Version, sha, pi.inst.Dir)
	old, err := os.ReadFile(hb.stampAt)
	st, serr := os.Stat(hb.dir)
	hb.stale = err != nil || string(old) != hb.stamp || serr != nil || !st.IsDir()
	if hb.stale {
		if err := os.RemoveAll(base); err != nil {
			return nil, compose.New(compose.CodeIOError, fmt.Sprintf("container %q: clear its workspace %s: %v", key, base, err))
		}
		if err := os.MkdirAll(base, 0o700); err != nil {
			return nil, compose.New(compose.CodeIOError, fmt.Sprintf("container %q: make its workspace %s: %v", key, base, err))
		}
		if err := copyPrivate(pi.inst.Dir, hb.dir); err != nil {
			return nil, compose.New(compose.CodeIOError, fmt.Sprintf("container %q: copy the bundle %s %s into its workspace %s: %v",
				key, pi.entry.Resolved.Name, pi.entry.Resolved.Version, hb.dir, err))
		}
	}
	m, err := loadManifest(key, hb.dir)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, compose.New(compose.CodeInvalidManifest, fmt.Sprintf("container %q: the bundle %s %s has no %s",
			key, pi.entry.Resolved.Name, pi.entry.Resolved.Version, ManifestFile))
	}
	if hb.command, err = commandOf(key, hb.dir, run, m); err != nil {
		return nil, err
	}
	hb.install = m.Scripts.Install
	return hb, nil
}

// finish runs scripts.install in a stale workspace, then marks it
// prepared. A failed install leaves it stale, so the next start installs
// again.
func (hb *hostBundle) finish(ctx context.Context, c *container, env []string, log *proc.Log) error {
	if !hb.stale {
		return nil
	}
	if strings.TrimSpace(hb.install) != "" {
		h := proc.Hook{Name: "scripts.install", Container: c.key, Command: hb.install, Dir: hb.dir, Env: env, Log: log}
		if err := h.Run(ctx); err != nil {
			return err
		}
	}
	if err := os.WriteFile(hb.stampAt, []byte(hb.stamp), 0o600); err != nil {
		return compose.New(compose.CodeIOError, fmt.Sprintf("container %q: mark its workspace prepared: %v", c.key, err))
	}
	return nil
}

// copyPrivate copies the tree src to dst (which must not exist), owner
// only: directories 0700, files 0600, or 0700 when executable in src.
// Symbolic links are copied as links.
func copyPrivate(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.Mkdir(out, 0o700)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, out)
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			mode := os.FileMode(0o600)
			if info.Mode()&0o111 != 0 {
				mode = 0o700
			}
			return copyFile(path, out, mode)
		}
		return nil // devices, sockets, pipes: not part of a bundle
	})
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

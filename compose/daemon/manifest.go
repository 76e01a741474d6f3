package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
)

// ManifestFile is a worker directory's manifest.
const ManifestFile = "iii.worker.yaml"

// maxManifestSize bounds iii.worker.yaml; real ones are a few lines.
const maxManifestSize = 1 << 20

// manifest is the part of iii.worker.yaml Compose needs. The file belongs
// to the worker's author and carries more (description, dependencies,
// resources); unknown keys are ignored.
type manifest struct {
	Name    string `yaml:"name"`
	Scripts struct {
		Start   string `yaml:"start"`
		Install string `yaml:"install"`
	} `yaml:"scripts"`
	Runtime struct {
		// Kind selects a VM worker's image when base_image is absent
		// (typescript, javascript, node, bun, python, rust).
		Kind      string `yaml:"kind"`
		BaseImage string `yaml:"base_image"`
	} `yaml:"runtime"`
	// Copy steers the copy of a VM worker's directory into its VM.
	Copy struct {
		// Include names top-level entries the copy leaves out by default
		// (node_modules, dist, …) to copy all the same: vendored
		// dependencies, a prebuilt build.
		Include []string `yaml:"include"`
		// Exclude lists further paths, relative to the worker's
		// directory, to leave out (and everything below them).
		Exclude []string `yaml:"exclude"`
	} `yaml:"copy"`
}

// maxCopyEntries bounds copy.include and copy.exclude each.
const maxCopyEntries = 64

// copyPaths is a VM worker's copy.include (plain names) and copy.exclude
// (turned into absolute paths under dir), checked: a path that is absolute
// or climbs out of dir, a name with a slash, or .iii is INVALID_MANIFEST.
func copyPaths(key, dir string, m *manifest) (include, exclude []string, err error) {
	if m == nil {
		return nil, nil, nil
	}
	where := filepath.Join(dir, ManifestFile)
	bad := func(format string, args ...any) error {
		return compose.New(compose.CodeInvalidManifest, fmt.Sprintf("container %q: %s: ", key, where)+fmt.Sprintf(format, args...))
	}
	if len(m.Copy.Include) > maxCopyEntries || len(m.Copy.Exclude) > maxCopyEntries {
		return nil, nil, bad("copy.include and copy.exclude take at most %d entries each", maxCopyEntries)
	}
	for i, n := range m.Copy.Include {
		if n == "" || n == "." || n == ".." || strings.ContainsAny(n, "/\\\x00") {
			return nil, nil, bad("copy.include[%d] %q must be the plain name of an entry at the top of the worker's directory (such as node_modules or dist)", i, clip(n, 80))
		}
		if n == ".iii" {
			return nil, nil, bad("copy.include[%d] is .iii: Compose's state (the project token among it) never enters a VM", i)
		}
		include = append(include, n)
	}
	for i, p := range m.Copy.Exclude {
		rel := filepath.Clean(filepath.FromSlash(p))
		if p == "" || strings.IndexByte(p, 0) >= 0 || filepath.IsAbs(rel) || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return nil, nil, bad("copy.exclude[%d] %q must be a path relative to the worker's directory, below it", i, clip(p, 80))
		}
		exclude = append(exclude, filepath.Join(dir, rel))
	}
	return include, exclude, nil
}

// parseManifest decodes iii.worker.yaml. Errors are INVALID_MANIFEST.
func parseManifest(data []byte, path string) (*manifest, error) {
	var m manifest
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&m); err != nil {
		if errors.Is(err, io.EOF) {
			return &m, nil
		}
		return nil, compose.New(compose.CodeInvalidManifest, fmt.Sprintf("%s is not a valid worker manifest: %v", path, err))
	}
	return &m, nil
}

// loadManifest reads a worker directory's iii.worker.yaml: nil (and no
// error) when there is none; MISSING_WORKER_DIRECTORY when dir is not a
// directory; INVALID_MANIFEST when the file cannot be read or decoded.
func loadManifest(key, dir string) (*manifest, error) {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, compose.New(compose.CodeMissingWorkerDirectory, fmt.Sprintf(
			"container %q: worker directory %s does not exist; fix the path:// in worker:", key, dir))
	}
	path := filepath.Join(dir, ManifestFile)
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, compose.New(compose.CodeInvalidManifest, fmt.Sprintf("container %q: cannot read %s: %v", key, path, err))
	}
	data, rerr := io.ReadAll(io.LimitReader(f, maxManifestSize+1))
	f.Close()
	if rerr != nil {
		return nil, compose.New(compose.CodeInvalidManifest, fmt.Sprintf("container %q: cannot read %s: %v", key, path, rerr))
	}
	if len(data) > maxManifestSize {
		return nil, compose.New(compose.CodeInvalidManifest, fmt.Sprintf("container %q: %s is larger than 1 MiB", key, path))
	}
	return parseManifest(data, path)
}

// startCommand is a path:// worker's start command: scripts.run from the
// compose file, else scripts.start from the worker's iii.worker.yaml.
func startCommand(key, dir, run string) (string, error) {
	m, err := loadManifest(key, dir)
	if err != nil {
		return "", err
	}
	return commandOf(key, dir, run, m)
}

// commandOf picks the start command of a worker whose manifest (nil when
// there is none) was read from dir.
func commandOf(key, dir, run string, m *manifest) (string, error) {
	if strings.TrimSpace(run) != "" {
		return run, nil
	}
	if m != nil && strings.TrimSpace(m.Scripts.Start) != "" {
		return m.Scripts.Start, nil
	}
	path := filepath.Join(dir, ManifestFile)
	where := path + " does not exist"
	if m != nil {
		where = path + " has no scripts.start"
	}
	return "", compose.New(compose.CodeMissingStartCommand, fmt.Sprintf(
		"container %q has no start command: %s; set containers.%s.scripts.run in the compose file, or scripts.start in %s", key, where, key, ManifestFile))
}

// kindImage is the image a VM worker's runtime.kind implies when its
// manifest names no runtime.base_image: the node and python presets of the
// adapter's catalog, and the public images upstream uses for the others.
func kindImage(kind string) (string, bool) {
	switch kind {
	case "", "node", "nodejs", "javascript", "typescript":
		return "node", true
	case "python":
		return "python", true
	case "bun":
		return "docker.io/oven/bun:latest", true
	case "rust":
		return "docker.io/library/rust:slim-bookworm", true
	}
	return "", false
}

// vmImage is the image a VM worker boots: runtime.base_image, else the one
// runtime.kind implies. An unknown kind is INVALID_MANIFEST.
func vmImage(key, dir string, m *manifest) (string, error) {
	if m != nil {
		if img := strings.TrimSpace(m.Runtime.BaseImage); img != "" {
			return img, nil
		}
	}
	kind := ""
	if m != nil {
		kind = strings.ToLower(strings.TrimSpace(m.Runtime.Kind))
	}
	if img, ok := kindImage(kind); ok {
		return img, nil
	}
	return "", compose.New(compose.CodeInvalidManifest, fmt.Sprintf(
		"container %q: %s has runtime.kind %q, which implies no image (known: typescript, javascript, node, bun, python, rust); set runtime.base_image to the image the worker runs in",
		key, filepath.Join(dir, ManifestFile), clip(kind, 40)))
}

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

// manifest is the part of iii.worker.yaml a host worker needs. The file
// belongs to the worker's author and carries more (description, install
// steps for bundles); unknown keys are ignored.
type manifest struct {
	Name    string `yaml:"name"`
	Scripts struct {
		Start   string `yaml:"start"`
		Install string `yaml:"install"`
	} `yaml:"scripts"`
	Runtime struct {
		BaseImage string `yaml:"base_image"`
	} `yaml:"runtime"`
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

// startCommand is a path:// worker's start command: scripts.run from the
// compose file, else scripts.start from the worker's iii.worker.yaml.
func startCommand(key, dir, run string) (string, error) {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", compose.New(compose.CodeMissingWorkerDirectory, fmt.Sprintf(
			"container %q: worker directory %s does not exist; fix the path:// in worker:", key, dir))
	}
	path := filepath.Join(dir, ManifestFile)
	f, err := os.Open(path)
	var m *manifest
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return "", compose.New(compose.CodeInvalidManifest, fmt.Sprintf("container %q: cannot read %s: %v", key, path, err))
	default:
		data, rerr := io.ReadAll(io.LimitReader(f, maxManifestSize+1))
		f.Close()
		if rerr != nil {
			return "", compose.New(compose.CodeInvalidManifest, fmt.Sprintf("container %q: cannot read %s: %v", key, path, rerr))
		}
		if len(data) > maxManifestSize {
			return "", compose.New(compose.CodeInvalidManifest, fmt.Sprintf("container %q: %s is larger than 1 MiB", key, path))
		}
		if m, err = parseManifest(data, path); err != nil {
			return "", err
		}
	}
	if m != nil && strings.TrimSpace(m.Runtime.BaseImage) != "" {
		return "", compose.New(compose.CodeSpawnFailed, fmt.Sprintf(
			"container %q: %s sets runtime.base_image, so the worker runs in a VM through the sandbox adapter, which this Compose does not do yet; remove runtime.base_image to run it as a host process", key, path))
	}
	if strings.TrimSpace(run) != "" {
		return run, nil
	}
	if m != nil && strings.TrimSpace(m.Scripts.Start) != "" {
		return m.Scripts.Start, nil
	}
	where := path + " does not exist"
	if m != nil {
		where = path + " has no scripts.start"
	}
	return "", compose.New(compose.CodeMissingStartCommand, fmt.Sprintf(
		"container %q has no start command: %s; set containers.%s.scripts.run in the compose file, or scripts.start in %s", key, where, key, ManifestFile))
}

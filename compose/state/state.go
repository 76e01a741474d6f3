// Package state is Compose's per-project state directory (spec §5.7):
// where it is, the records of the processes Compose started (state.json),
// adoption of those processes after a crash, the locks that keep a project
// and its managed engine to one Compose at a time, the generated engine
// config, and the config/ and logs/ subdirectories.
package state

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/iii-sandbox/iii/compose"
)

// EnvStateDir moves every project's state (and the package cache) under
// one directory.
const EnvStateDir = "III_COMPOSE_STATE_DIR"

// Names inside a state directory.
const (
	StateFile        = "state.json"
	EngineLockFile   = "engine.lock"
	EngineConfigFile = "engine-config.yaml"
	EngineLogName    = "engine" // the rotating log engine.log
	ConfigDir        = "config"
	LogsDir          = "logs"
	// projectLockFile is held by the Compose that has the project loaded,
	// so the same project and namespace never run twice.
	projectLockFile = "project.lock"
)

// Slug names a project under III_COMPOSE_STATE_DIR: the name of the
// compose file's directory with every character outside [A-Za-z0-9] turned
// into '-' ("project" when that leaves nothing), then '-' and the first 8
// hex digits of the SHA-256 of the canonical compose-file path.
func Slug(composePath string) string {
	sum := sha256.Sum256([]byte(composePath))
	return slugName(composePath) + "-" + hex.EncodeToString(sum[:])[:8]
}

// LocationSlug is Slug for the project's state as it is placed now: with
// III_COMPOSE_STATE_DIR set, the hash also covers that directory, so the
// slug changes when the project moves, is renamed, or its state moves.
// Compose derives the vm_ids of a project's worker VMs from it: a VM whose
// project state moved starts from fresh state, as the state it had stays
// with the old location.
func LocationSlug(composePath string, getenv func(string) string) string {
	d := getenv(EnvStateDir)
	if d == "" {
		return Slug(composePath)
	}
	if abs, err := filepath.Abs(d); err == nil {
		d = abs
	}
	sum := sha256.Sum256([]byte(composePath + "\x00" + filepath.Clean(d)))
	return slugName(composePath) + "-" + hex.EncodeToString(sum[:])[:8]
}

func slugName(composePath string) string {
	base := filepath.Base(filepath.Dir(composePath))
	var b strings.Builder
	for _, r := range base {
		if (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	name := b.String()
	if name == "" || base == "/" || base == "." {
		name = "project"
	}
	return name
}

// DirFor is the state directory of the project whose canonical compose
// file is composePath, in namespace ns: <project-dir>/.iii/compose/<ns>/,
// or $III_COMPOSE_STATE_DIR/<slug>/<ns>/.
func DirFor(composePath, ns string, getenv func(string) string) string {
	if d := getenv(EnvStateDir); d != "" {
		if abs, err := filepath.Abs(d); err == nil {
			d = abs
		}
		return filepath.Join(d, Slug(composePath), ns)
	}
	return filepath.Join(filepath.Dir(composePath), ".iii", "compose", ns)
}

func ioError(what string, err error) error {
	return compose.New(compose.CodeIOError, fmt.Sprintf("%s: %v", what, err))
}

// writeAtomic writes data to path through a temporary file in the same
// directory: fsync, rename, fsync of the directory. Readers see the old
// file or the new one, never a mix.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// WriteFileAtomic is writeAtomic for the rest of Compose (the compose file
// edits of compose::add keep the file's mode).
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	return writeAtomic(path, data, mode)
}

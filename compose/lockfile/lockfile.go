// Package lockfile is worker-compose.lock (spec §5.6, docs/lockfile.md):
// the concrete result of resolving a project's package:// containers —
// versions, package types, artefact URLs and SHA-256 digests per target
// triple, the registry's default configuration, and which dependencies
// each registry root generated. Decoding is strict (unknown or duplicate
// keys are INVALID_COMPOSE_LOCK); encoding is deterministic (sorted keys);
// writing is atomic and happens only when the content changed.
package lockfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/internal/lazyre"
)

// Format constants.
const (
	// SchemaVersion is the only version: key this build reads and writes.
	SchemaVersion = 1
	// Ext replaces the compose file's extension.
	Ext = ".lock"
	// Mode is the lock's permission bits: it is committed, not secret.
	Mode = 0o644
	// MaxSize bounds a lock file.
	MaxSize = 4 << 20
	// Type values of resolved.type.
	TypeBinary = "binary"
	TypeBundle = "bundle"
	// PackageScheme prefixes every locked worker.
	PackageScheme = "package://"
)

var (
	keyRE    = lazyre.New(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	safeRE   = lazyre.New(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	sha256RE = lazyre.New(`^[0-9a-f]{64}$`)
)

// Lock is a decoded worker-compose.lock.
type Lock struct {
	// Containers are the package:// containers, by container key.
	Containers map[string]*Entry
	// Graphs maps an explicit registry root to the containers its
	// resolution pulled in (itself included); nil when absent.
	Graphs map[string][]string
}

// Entry is one locked container.
type Entry struct {
	// Worker is the container's worker: reference, package://…
	Worker string
	// Requested is the selector the compose file has ("*" if absent).
	Requested string
	Resolved  Resolved
}

// Resolved is what the selector resolved to.
type Resolved struct {
	Name      string
	Version   string
	Type      string // binary | bundle
	Artifacts map[string]Artifact
	// DefaultConfig is the package's default configuration (YAML
	// values: map[string]any, []any, string, bool, int, float64, nil).
	DefaultConfig any
}

// Artifact is one target's archive.
type Artifact struct {
	URL    string
	SHA256 string
}

// New returns an empty lock.
func New() *Lock { return &Lock{Containers: map[string]*Entry{}} }

// PathFor is the lock of a compose file: its path with the extension
// replaced by .lock (config/worker-compose.yaml → config/worker-compose.lock).
func PathFor(composePath string) string {
	ext := filepath.Ext(composePath)
	return strings.TrimSuffix(composePath, ext) + Ext
}

// EntryOf returns the entry of a container; nil for a nil lock or a
// container it does not lock.
func (l *Lock) EntryOf(key string) *Entry {
	if l == nil {
		return nil
	}
	return l.Containers[key]
}

// Clone returns a deep copy (default configurations are shared: they are
// never modified in place).
func (l *Lock) Clone() *Lock {
	if l == nil {
		return nil
	}
	out := New()
	for k, e := range l.Containers {
		c := *e
		c.Resolved.Artifacts = make(map[string]Artifact, len(e.Resolved.Artifacts))
		for t, a := range e.Resolved.Artifacts {
			c.Resolved.Artifacts[t] = a
		}
		out.Containers[k] = &c
	}
	if l.Graphs != nil {
		out.Graphs = make(map[string][]string, len(l.Graphs))
		for k, v := range l.Graphs {
			out.Graphs[k] = slices.Clone(v)
		}
	}
	return out
}

// Read reads and decodes the lock at path; (nil, nil) when there is none.
func Read(path string) (*Lock, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, compose.New(compose.CodeInvalidComposeLock, fmt.Sprintf("cannot read %s: %v", path, unwrapPath(err)))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, compose.New(compose.CodeInvalidComposeLock, fmt.Sprintf("cannot read %s: %v", path, err))
	}
	return Decode(data, path)
}

// Write writes l to path atomically (temp file, fsync, rename, 0644) when
// its encoding differs from what the file holds; changed reports a write.
func Write(path string, l *Lock) (changed bool, err error) {
	data := l.Encode()
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	if err := state.WriteFileAtomic(path, data, Mode); err != nil {
		return false, compose.New(compose.CodeIOError, fmt.Sprintf("write %s: %v", path, unwrapPath(err)))
	}
	return true, nil
}

// SameDeclaration reports whether the entry was resolved for this worker
// reference and selector: only then is it reused without resolving.
func (e *Entry) SameDeclaration(worker, requested string) bool {
	return e != nil && e.Worker == worker && e.Requested == RequestedOf(requested)
}

// RequestedOf is the requested: value of a selector ("*" when none).
func RequestedOf(sel string) string {
	if sel == "" {
		return "*"
	}
	return sel
}

// RuntimeChanged reports whether b runs different content than a on
// target (which forces a restart): the type, the default configuration or
// the target's digest differ. A new URL with the same digest does not
// count.
func RuntimeChanged(a, b *Entry, target string) bool {
	if a == nil || b == nil {
		return a != b
	}
	if a.Resolved.Type != b.Resolved.Type || !ConfigEqual(a.Resolved.DefaultConfig, b.Resolved.DefaultConfig) {
		return true
	}
	return a.Resolved.Artifacts[target].SHA256 != b.Resolved.Artifacts[target].SHA256
}

// ConfigEqual compares two default configurations by value (1 and 1.0,
// map order, all the same).
func ConfigEqual(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// ConfigFromJSON turns a registry's default_config (JSON) into the value
// the lock holds: integers stay integers, other numbers become floats.
func ConfigFromJSON(raw json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return fromNumbers(v), nil
}

func fromNumbers(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			t[k] = fromNumbers(x)
		}
		return t
	case []any:
		for i, x := range t {
			t[i] = fromNumbers(x)
		}
		return t
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return int(i)
		}
		if f, err := t.Float64(); err == nil {
			return f
		}
		return t.String()
	}
	return v
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Package composefile is the worker-compose.yaml file model: reading it,
// Compose interpolation, strict decoding, validation, the start-order graph,
// and the file's JSON Schema. Every error it returns is a *compose.Error.
package composefile

import (
	"time"

	"gopkg.in/yaml.v3"
)

// Defaults of spec §5.2.
const (
	DefaultNamespace      = "default"
	DefaultStartupTimeout = 60 * time.Second
	DefaultStopTimeout    = 10 * time.Second
	DefaultPreRunTimeout  = 60 * time.Second
	DefaultEngineURL      = "ws://127.0.0.1:49134"
	DefaultSandboxAdapter = "sandbox-libkrun"
	// FileName is the file Compose reads when none is named.
	FileName = "worker-compose.yaml"
)

// File is one parsed and validated worker-compose.yaml.
type File struct {
	Path           string // canonical (symlinks resolved) absolute path of the file
	Dir            string // its directory (the project dir)
	Namespace      string // the file's namespace, or "default"
	NamespaceSet   bool   // the file sets namespace:
	StartupTimeout time.Duration
	StopTimeout    time.Duration
	Engine         *Engine // nil when the file has no engine: key
	Containers     map[string]*Container
	Order          []string // container keys in file order
}

// Engine is the engine: section. Its presence means this Compose invocation
// owns the engine.
type Engine struct {
	// Empty is `engine:` with nothing under it: start no engine and attach
	// to whatever engine holds the address.
	Empty bool
	URL   string // default ws://127.0.0.1:49134
	// RegistrationNamespaceGraceMS is passed through to the engine; nil
	// leaves the engine default.
	RegistrationNamespaceGraceMS *int
	Workers                      []EngineWorker  // in file order
	Sandbox                      *SandboxBinding // nil when absent
}

// EngineWorker is one engine.workers entry. Config is opaque to Compose:
// never interpolated (the engine expands its own ${VAR:default} syntax), and
// decoded with YAML types kept (ints stay int, floats float64, null nil) so
// the generated engine config says exactly what the user wrote.
type EngineWorker struct {
	Name   string         // e.g. "iii-worker-manager" or "iii-worker-manager#rbac"
	Config map[string]any // never nil; {} = the worker's defaults
	// Node is the value as written (references restored, aliases
	// unfolded). Write EngineNode(), not Config, into the generated engine
	// config.yaml: it keeps plain vs quoted style, and the engine types a
	// plain ${PORT:3112} as a number but a quoted one as a string.
	Node *yaml.Node `json:"-"`
	Line int        // line of the key in the file
}

// SandboxBinding is engine.sandbox: which adapter the engine's sandbox
// router forwards to, and in which namespace it runs.
type SandboxBinding struct {
	Adapter   string // default sandbox-libkrun
	Namespace string // default: the project namespace
	// NamespaceSet is true when the file sets engine.sandbox.namespace;
	// otherwise Namespace follows the project namespace (File.SetNamespace).
	NamespaceSet bool
}

// Container is one containers.<key> entry; Key is the worker name it must
// register under.
type Container struct {
	Key        string
	Worker     string // as written (after interpolation)
	Source     Source
	Version    string // selector as written; required for package://
	Runtime    string // "", "host" or "vm"
	StartAfter []string
	ConfigName string
	// ConfigOverride is never interpolated; nil when absent. YAML null
	// values stay as explicit nil entries, because null is a value that
	// overrides in the configuration merge.
	ConfigOverride map[string]any
	// WorkingDir is absolute, resolved against the file's dir; "" means
	// the worker's own directory.
	WorkingDir     string
	Environment    map[string]string // never nil
	EnvFile        []string          // absolute paths, in order (a later file wins)
	StartupTimeout time.Duration     // the container's value, else the file's
	Scripts        Scripts
	Line           int // line of the key in the file
}

// SourceKind says where a container's worker comes from.
type SourceKind string

// The two worker sources Compose accepts.
const (
	SourcePath    SourceKind = "path"
	SourcePackage SourceKind = "package"
)

// Source is a parsed worker: reference.
type Source struct {
	Kind SourceKind
	// Path is the absolute worker directory for path://.
	Path string
	// Registry is the host of package://host/name; "" = the default
	// registry.
	Registry string
	// Name is the package name for package://.
	Name string
}

// Scripts are a container's hooks and start command.
type Scripts struct {
	PreRun        string
	PreRunTimeout time.Duration // default 60s
	Run           string
	PostRun       string
}

// IsAdapter reports whether the container is the sandbox adapter package
// named adapter (the daemon starts such a container through the plugin
// host instead of as a host process).
func (c *Container) IsAdapter(adapter string) bool {
	return c.Source.Kind == SourcePackage && c.Source.Name == adapter
}

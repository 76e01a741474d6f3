// Package workerkit is what the registry workers written in Go here (state;
// queue, cron and http next) share: the life of a worker binary that
// Compose installs from a package and starts.
//
// Compose starts a package worker with (docs/compose.md, "Worker
// environment"): III_URL (the engine), III_NAMESPACE (the project's),
// III_WORKER_NAME (the container key), III_CONFIG (the merged
// configuration as a YAML file: the package's default config < the
// configuration entry named by config_name < config_override; absent when
// there is none), III_CONFIG_NAME (the config_name, when declared),
// III_COMPOSE_DIR (the compose file's directory) and III_ISOLATION. It
// gives no engine token: these workers need none.
//
// The kit turns that into:
//
//  1. Config: III_CONFIG read as JSON with ${VAR} / ${VAR:default}
//     placeholders expanded from the worker's own environment (Compose
//     writes the template form), else Spec.DefaultConfig. A worker reads
//     it before it connects, so it opens its store (and can refuse a bad
//     configuration) before the engine lists it, and Compose sees it ready
//     only once it serves.
//  2. Connect: a client.Client named III_WORKER_NAME in III_NAMESPACE,
//     reconnecting forever with the SDKs' backoff.
//  3. WatchConfig: registers <name>::on-config-change (upstream's reload
//     hook, {} → {ok}) and a `configuration` trigger on the entry
//     III_CONFIG_NAME, else the worker name, and applies the entry over the
//     file whenever it changes (and once at once, when it exists). Entries
//     and triggers reach a worker without the engine token in template
//     form, so they are expanded from its environment too.
//  4. Main: SIGTERM/SIGINT cancel the context the worker runs with, then
//     the client closes; hclog to stderr (III_LOG_LEVEL, default info);
//     the exit code says whether it ended cleanly.
//
// A worker's main is:
//
//	func main() {
//		os.Exit(workerkit.Main(workerkit.Spec{Name: "state", Version: state.Version,
//			DefaultConfig: json.RawMessage(state.DefaultConfig)}, run))
//	}
//
//	func run(ctx context.Context, k *workerkit.Kit) error {
//		cfg, err := k.FileConfig()   // open the worker's resources with it
//		...
//		if err := k.Connect(ctx); err != nil { return err }
//		... register functions and trigger types on k.Client ...
//		if err := k.WatchConfig(ctx, apply); err != nil { return err }
//		<-ctx.Done()
//		return nil // Main closes the client; close your resources here
//	}
package workerkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/internal/envexpand"
	"github.com/iii-sandbox/iii/protocol"
)

// Environment variables Compose sets (compose/daemon/env.go).
const (
	EnvURL        = "III_URL"
	EnvNamespace  = "III_NAMESPACE"
	EnvWorkerName = "III_WORKER_NAME"
	EnvConfig     = "III_CONFIG"
	EnvConfigName = "III_CONFIG_NAME"
	EnvComposeDir = "III_COMPOSE_DIR"
	// EnvLogLevel sets the log level (trace, debug, info, warn, error).
	EnvLogLevel = "III_LOG_LEVEL"
)

// DefaultURL is the engine a worker started by hand connects to.
const DefaultURL = "ws://127.0.0.1:49134"

// closeTimeout bounds the client's close at the end.
const closeTimeout = 10 * time.Second

// Env is what the worker was started with.
type Env struct {
	URL        string // III_URL, else DefaultURL
	Namespace  string // III_NAMESPACE ("" = default)
	WorkerName string // III_WORKER_NAME, else Spec.Name
	ConfigPath string // III_CONFIG ("" = none)
	ConfigName string // III_CONFIG_NAME ("" = none)
	ComposeDir string // III_COMPOSE_DIR ("" = none)
}

// EnvFrom reads Env with getenv; name is the worker name without
// III_WORKER_NAME.
func EnvFrom(getenv func(string) string, name string) Env {
	e := Env{
		URL:        strings.TrimSpace(getenv(EnvURL)),
		Namespace:  strings.TrimSpace(getenv(EnvNamespace)),
		WorkerName: strings.TrimSpace(getenv(EnvWorkerName)),
		ConfigPath: getenv(EnvConfig),
		ConfigName: strings.TrimSpace(getenv(EnvConfigName)),
		ComposeDir: getenv(EnvComposeDir),
	}
	if e.URL == "" {
		e.URL = DefaultURL
	}
	if e.WorkerName == "" {
		e.WorkerName = name
	}
	return e
}

// BaseDir is where a worker's relative paths are anchored: the compose
// file's directory, else the working directory.
func (e Env) BaseDir() string {
	if e.ComposeDir != "" {
		return e.ComposeDir
	}
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	return wd
}

// EntryID is the worker's configuration entry: III_CONFIG_NAME, else the
// worker name (upstream: entry id = worker name).
func (e Env) EntryID() string {
	if e.ConfigName != "" {
		return e.ConfigName
	}
	return e.WorkerName
}

// Spec describes the worker.
type Spec struct {
	// Name is the package's name: the default worker name and the prefix
	// of <name>::on-config-change.
	Name        string
	Description string
	Version     string
	// DefaultConfig is the configuration without III_CONFIG (the
	// package's default config, as published).
	DefaultConfig json.RawMessage
	// Getenv defaults to os.Getenv; Logger to hclog on stderr.
	Getenv func(string) string
	Logger hclog.Logger
}

// Kit is one worker's connection and configuration.
type Kit struct {
	Spec   Spec
	Env    Env
	Log    hclog.Logger
	Client *client.Client // nil until Connect

	getenv  func(string) string
	fileCfg json.RawMessage

	mu      sync.Mutex // serializes applies
	applied json.RawMessage
}

// New reads the environment and III_CONFIG. It does not connect.
func New(spec Spec) (*Kit, error) {
	if spec.Getenv == nil {
		spec.Getenv = os.Getenv
	}
	if spec.Logger == nil {
		lvl := hclog.LevelFromString(spec.Getenv(EnvLogLevel))
		if lvl == hclog.NoLevel {
			lvl = hclog.Info
		}
		spec.Logger = hclog.New(&hclog.LoggerOptions{Name: spec.Name, Level: lvl, Output: os.Stderr})
	}
	k := &Kit{Spec: spec, Env: EnvFrom(spec.Getenv, spec.Name), Log: spec.Logger, getenv: spec.Getenv}
	cfg, err := k.readFile()
	if err != nil {
		return nil, err
	}
	k.fileCfg = cfg
	return k, nil
}

// readFile is III_CONFIG as JSON, expanded; DefaultConfig without it.
func (k *Kit) readFile() (json.RawMessage, error) {
	if k.Env.ConfigPath == "" {
		if len(k.Spec.DefaultConfig) == 0 {
			return json.RawMessage("null"), nil
		}
		return k.expand(k.Spec.DefaultConfig)
	}
	b, err := os.ReadFile(k.Env.ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("read the configuration %s (III_CONFIG): %w", k.Env.ConfigPath, err)
	}
	j, err := YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("configuration %s (III_CONFIG): %w", k.Env.ConfigPath, err)
	}
	return k.expand(j)
}

// FileConfig is the configuration the worker starts with: III_CONFIG (or
// the default config), placeholders expanded.
func (k *Kit) FileConfig() json.RawMessage { return k.fileCfg }

// YAMLToJSON converts one YAML document (JSON is YAML) to JSON; an empty
// document is null.
func YAMLToJSON(b []byte) (json.RawMessage, error) {
	var v any
	if err := yaml.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	v, err := jsonable(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func jsonable(v any) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		for k, c := range t {
			n, err := jsonable(c)
			if err != nil {
				return nil, err
			}
			t[k] = n
		}
		return t, nil
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, c := range t {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("mapping key %v is not a string", k)
			}
			n, err := jsonable(c)
			if err != nil {
				return nil, err
			}
			out[ks] = n
		}
		return out, nil
	case []any:
		for i, c := range t {
			n, err := jsonable(c)
			if err != nil {
				return nil, err
			}
			t[i] = n
		}
		return t, nil
	}
	return v, nil
}

// expand replaces ${VAR} and ${VAR:default} in every string of a JSON
// value from the worker's environment. A string that is exactly one
// placeholder takes the type its text reads as in YAML ("${N:5}" is the
// number 5), as the configuration worker's own expansion does; an unset
// variable without a default stays as written.
func (k *Kit) expand(raw json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("configuration is not JSON: %w", err)
	}
	lookup := func(name string) (string, bool) {
		s := k.getenv(name)
		return s, s != ""
	}
	var walk func(any) any
	walk = func(v any) any {
		switch t := v.(type) {
		case string:
			out, _ := envexpand.Expand(t, lookup, nil)
			if out != t && envexpand.IsSinglePlaceholder(t) {
				var typed any
				if yaml.Unmarshal([]byte(out), &typed) == nil {
					switch typed.(type) {
					case bool, int, float64, nil:
						return typed
					}
				}
			}
			return out
		case map[string]any:
			for k, c := range t {
				t[k] = walk(c)
			}
		case []any:
			for i, c := range t {
				t[i] = walk(c)
			}
		}
		return v
	}
	return json.Marshal(walk(v))
}

// Connect dials the engine as the worker, retrying until ctx ends.
func (k *Kit) Connect(ctx context.Context) error {
	c, err := client.Dial(ctx, k.Env.URL, client.Options{
		Name: k.Env.WorkerName, Namespace: k.Env.Namespace, Description: k.Spec.Description,
		Version: k.Spec.Version, IgnoreEnv: true, Logger: k.Log.Named("client"),
		OnRegistrationError: func(err error) { k.Log.Error("the engine refused a registration", "error", err) },
	})
	if err != nil {
		return fmt.Errorf("connect to the engine at %s: %w", k.Env.URL, err)
	}
	k.Client = c
	k.Log.Info("connected", "url", k.Env.URL, "namespace", k.Env.Namespace, "worker", k.Env.WorkerName)
	return nil
}

// entryIDPattern is the configuration worker's id rule.
var entryIDPattern = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// ConfigChangeFunction is the reload hook's id.
func (k *Kit) ConfigChangeFunction() string { return k.Spec.Name + "::on-config-change" }

// WatchConfig keeps the worker in step with its configuration entry:
// apply is called with the file configuration merged under the entry's
// value (Compose's merge: mappings key by key, the rest replaced)
// whenever that changes, including once now when the entry exists. apply
// runs one call at a time; its error is logged (the worker keeps what it
// had).
func (k *Kit) WatchConfig(ctx context.Context, apply func(context.Context, json.RawMessage) error) error {
	if k.Client == nil {
		return errors.New("workerkit: WatchConfig before Connect")
	}
	k.applied = k.fileCfg
	reload := func(ctx context.Context) {
		if err := k.reload(ctx, apply); err != nil {
			k.Log.Warn("configuration not applied", "entry", k.Env.EntryID(), "error", err)
		}
	}
	if _, err := k.Client.RegisterFunction(client.FunctionDef{ID: k.ConfigChangeFunction(),
		Description:    "Reload the worker's configuration entry",
		RequestSchema:  json.RawMessage(`{"type":"object"}`),
		ResponseSchema: json.RawMessage(`{"type":"object","properties":{"ok":{"type":"boolean"}}}`),
	}, func(ctx context.Context, _ *client.Invocation) (any, error) {
		reload(ctx)
		return map[string]bool{"ok": true}, nil
	}); err != nil {
		return err
	}
	id := k.Env.EntryID()
	if !entryIDPattern.MatchString(id) {
		k.Log.Warn("not watching the configuration entry: its id is not a valid configuration id", "entry", id)
		return nil
	}
	cfg, _ := json.Marshal(map[string]any{"configuration_id": id})
	if _, err := k.Client.RegisterTrigger(client.TriggerDef{TriggerType: "configuration",
		FunctionID: k.ConfigChangeFunction(), Config: cfg}); err != nil {
		return err
	}
	reload(ctx)
	return nil
}

// reload reads the entry and applies file < entry when it differs from
// what was applied last.
func (k *Kit) reload(ctx context.Context, apply func(context.Context, json.RawMessage) error) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	entry, ok, err := k.Entry(ctx)
	if err != nil {
		return err
	}
	next := k.fileCfg
	if ok {
		if next, err = MergeJSON(k.fileCfg, entry); err != nil {
			return err
		}
		if next, err = k.expand(next); err != nil {
			return err
		}
	}
	if jsonEqual(next, k.applied) {
		return nil
	}
	if err := apply(ctx, next); err != nil {
		return err
	}
	k.applied = next
	k.Log.Info("configuration applied", "entry", k.Env.EntryID())
	return nil
}

// Entry reads the configuration entry (template form; ok false when the
// entry, or the configuration worker, does not exist).
func (k *Kit) Entry(ctx context.Context) (json.RawMessage, bool, error) {
	raw, err := k.Client.Call(ctx, "configuration::get", map[string]any{"id": k.Env.EntryID(), "raw": true},
		client.WithNamespace("default"), client.WithTimeout(30*time.Second))
	if err != nil {
		var eb *protocol.ErrorBody
		if errors.As(err, &eb) && (eb.Code == "NOT_FOUND" || strings.Contains(strings.ToLower(eb.Code), "not_found")) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("configuration::get %s: %w", k.Env.EntryID(), err)
	}
	var out struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, false, fmt.Errorf("configuration::get %s answered %s", k.Env.EntryID(), raw)
	}
	if len(out.Value) == 0 || bytes.Equal(out.Value, []byte("null")) {
		return nil, false, nil
	}
	return out.Value, true, nil
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// MergeJSON lays over on base as Compose merges configuration layers:
// mappings key by key, lists and scalars replaced, a mapping whose `name`
// over changes replaced whole.
func MergeJSON(base, over json.RawMessage) (json.RawMessage, error) {
	var b, o any
	if err := json.Unmarshal(base, &b); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(over, &o); err != nil {
		return nil, err
	}
	return json.Marshal(merge(b, o))
}

func merge(base, over any) any {
	bm, ok1 := base.(map[string]any)
	om, ok2 := over.(map[string]any)
	if !ok1 || !ok2 {
		return over
	}
	if bn, ok := bm["name"]; ok {
		if on, ok := om["name"]; ok && !reflect.DeepEqual(bn, on) {
			return over
		}
	}
	out := make(map[string]any, len(bm)+len(om))
	for k, v := range bm {
		out[k] = v
	}
	for k, v := range om {
		if bv, ok := out[k]; ok {
			out[k] = merge(bv, v)
		} else {
			out[k] = v
		}
	}
	return out
}

// Close closes the client (bounded).
func (k *Kit) Close() error {
	if k.Client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	return k.Client.Close(ctx)
}

// Main runs a worker binary: New, then run with a context that SIGTERM or
// SIGINT cancels, then Close. It returns the process's exit code: 0 when
// run returned nil, 1 (the error logged) otherwise.
func Main(spec Spec, run func(ctx context.Context, k *Kit) error) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return MainContext(ctx, spec, run)
}

// MainContext is Main with the caller's context instead of the signals
// (tests run a worker in-process this way).
func MainContext(ctx context.Context, spec Spec, run func(ctx context.Context, k *Kit) error) int {
	k, err := New(spec)
	if err != nil {
		if spec.Logger != nil {
			spec.Logger.Error("cannot start", "error", err)
		} else {
			fmt.Fprintf(os.Stderr, "%s: cannot start: %v\n", spec.Name, err)
		}
		return 1
	}
	runErr := run(ctx, k)
	closeErr := k.Close()
	if runErr != nil {
		k.Log.Error("stopped", "error", runErr)
		return 1
	}
	if closeErr != nil {
		k.Log.Warn("closing the connection", "error", closeErr)
	}
	k.Log.Info("stopped")
	return 0
}

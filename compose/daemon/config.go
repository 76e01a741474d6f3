package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/protocol"
)

// Configuration worker functions and the code of a missing entry.
const (
	fnConfigGet      = "configuration::get"
	fnConfigSet      = "configuration::set"
	fnConfigRegister = "configuration::register"
	codeNotFound     = "NOT_FOUND"
	codeNotReg       = "NOT_REGISTERED"
	codeSchemaUnav   = "SCHEMA_UNAVAILABLE"
)

// normalize turns any JSON- or YAML-decoded value into the canonical form
// the merge works on: map[string]any, []any, string, bool, nil, and
// json.Number for every number (so 3 stays 3 and 1.5 stays 1.5 through
// the round trips).
func normalize(v any) (any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return decodeJSON(data)
}

func decodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

// mergeConfig applies over on top of base (spec §5.4): mappings merge key
// by key, lists and scalars replace, null is an explicit value, and a
// mapping whose `name` the override changes is replaced whole, because its
// other keys belong to the variant that name selects.
func mergeConfig(base, over any) any {
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
			out[k] = mergeConfig(bv, v)
		} else {
			out[k] = v
		}
	}
	return out
}

// layers are the configuration layers of one container, lowest first;
// nil entries are absent layers.
type layers struct {
	defaults any
	hasDef   bool
	entry    any
	hasEntry bool
	override any
	hasOver  bool
}

// merged folds the present layers; ok is false when there is none (the
// worker then gets no III_CONFIG).
func (l layers) merged() (any, bool) {
	var out any
	ok := false
	for _, layer := range []struct {
		v  any
		ok bool
	}{{l.defaults, l.hasDef}, {l.entry, l.hasEntry}, {l.override, l.hasOver}} {
		if !layer.ok {
			continue
		}
		if !ok {
			out, ok = layer.v, true
			continue
		}
		out = mergeConfig(out, layer.v)
	}
	return out, ok
}

// fetchEntry reads a configuration entry in its template form. A missing
// entry is not an error (ok false); any other failure is
// CONFIG_FETCH_FAILED: a container never starts on stale defaults.
func fetchEntry(ctx context.Context, e engineCaller, id, container string) (any, bool, error) {
	raw, err := e.Call(ctx, fnConfigGet, map[string]any{"id": id, "raw": true}, inDefault())
	if err != nil {
		var eb *protocol.ErrorBody
		if errors.As(err, &eb) && eb.Code == codeNotFound {
			return nil, false, nil
		}
		return nil, false, compose.New(compose.CodeConfigFetchFailed, fmt.Sprintf(
			"container %q: cannot read configuration entry %q (configuration::get): %v; the container was not started", container, id, err))
	}
	var out struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, false, compose.New(compose.CodeConfigFetchFailed, fmt.Sprintf(
			"container %q: configuration::get %q returned %s, not {id, value}", container, id, clip(string(raw), 200)))
	}
	if len(out.Value) == 0 {
		out.Value = json.RawMessage("null")
	}
	v, err := decodeJSON(out.Value)
	if err != nil {
		return nil, false, compose.New(compose.CodeConfigFetchFailed, fmt.Sprintf("container %q: entry %q: %v", container, id, err))
	}
	return v, true, nil
}

// publishEntry stores the merged configuration back under the container's
// config_name: set when the entry is registered, else register it (with a
// schema that accepts any value; the worker registers its own schema when
// it starts).
func publishEntry(ctx context.Context, e engineCaller, id, container string, value any, existed bool) error {
	fail := func(err error) error {
		return compose.New(compose.CodeConfigPublishFailed, fmt.Sprintf(
			"container %q: cannot publish the merged configuration to entry %q: %v; the container was not started", container, id, err))
	}
	if existed {
		_, err := e.Call(ctx, fnConfigSet, map[string]any{"id": id, "value": value}, inDefault())
		if err == nil {
			return nil
		}
		var eb *protocol.ErrorBody
		if !errors.As(err, &eb) || (eb.Code != codeNotReg && eb.Code != codeSchemaUnav) {
			return fail(err)
		}
	}
	_, err := e.Call(ctx, fnConfigRegister, map[string]any{
		"id": id, "name": id,
		"description":   fmt.Sprintf("Configuration of the Compose container %q", container),
		"schema":        map[string]any{},
		"initial_value": value,
	}, inDefault())
	if err != nil {
		return fail(err)
	}
	return nil
}

// writeConfigFile writes a container's merged configuration, owner-only,
// as <state>/config/<key>.yaml and returns its path.
func writeConfigFile(dir, key string, value any) (string, error) {
	data, err := yamlOf(value)
	if err != nil {
		return "", compose.New(compose.CodeIOError, fmt.Sprintf("container %q: encode its configuration: %v", key, err))
	}
	path := filepath.Join(dir, key+".yaml")
	if err := state.WriteFileAtomic(path, data, 0o600); err != nil {
		return "", compose.New(compose.CodeIOError, fmt.Sprintf("container %q: write %s: %v", key, path, err))
	}
	return path, nil
}

// yamlOf renders a normalized value as YAML, numbers as numbers.
func yamlOf(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(yamlValue(v)); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func yamlValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			out[k] = yamlValue(x)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = yamlValue(x)
		}
		return out
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i
		}
		if f, err := t.Float64(); err == nil && !math.IsInf(f, 0) {
			return f
		}
		return t.String()
	default:
		return v
	}
}

func clip(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

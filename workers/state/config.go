package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"
)

// Version is the state package this worker is published as. It sits in
// upstream's trigger-type generation (state ≤0.22.x, trigger type
// `state`), below 0.22.20, the first release known to add state::barrier,
// which this worker does not serve (docs/standard-workers.md).
const Version = "0.22.19"

// Name is the worker's (and the package's) name; its configuration entry
// and function prefix.
const Name = "state"

// Defaults of the configuration (upstream's).
const (
	DefaultSaveInterval = 5 * time.Second
	MinSaveInterval     = 100 * time.Millisecond
	MaxSaveInterval     = time.Hour
	DefaultFilePath     = "data/state"
	DefaultRedisURL     = "redis://localhost:6379"
)

// DefaultConfig is the registry seed, the package's default
// configuration.
const DefaultConfig = `{"adapter":{"name":"kv","config":{"store_method":"file_based"}}}`

// Config is the worker's configuration entry (upstream's StateConfig).
// Unknown keys are refused, as upstream's deny_unknown_fields.
type Config struct {
	Adapter         *AdapterConfig `json:"adapter,omitempty"`
	TriggersEnabled *bool          `json:"triggers_enabled,omitempty"`
	MaxValueBytes   *int64         `json:"max_value_bytes,omitempty"`
	SaveIntervalMS  *int64         `json:"save_interval_ms,omitempty"`
}

// AdapterConfig selects the store: kv (default) or redis.
type AdapterConfig struct {
	Name   string          `json:"name"`
	Config json.RawMessage `json:"config,omitempty"`
}

// KVConfig is the kv adapter's config.
type KVConfig struct {
	StoreMethod    string `json:"store_method,omitempty"` // in_memory (default) | file_based
	FilePath       string `json:"file_path,omitempty"`
	SaveIntervalMS *int64 `json:"save_interval_ms,omitempty"`
}

// RedisConfig is the redis adapter's config.
type RedisConfig struct {
	RedisURL string `json:"redis_url,omitempty"`
}

// StoreSpec is what the adapter part of a configuration resolves to.
type StoreSpec struct {
	Adapter      string // kv | redis
	Persist      bool   // kv file_based
	Dir          string // kv file_based: absolute directory
	RedisURL     string
	SaveInterval time.Duration
}

func strictDecode(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

// ParseConfig reads a configuration value (JSON; null or empty is the
// defaults). Out-of-range knobs fall back to their defaults as upstream's
// normalized() does; unknown keys and wrong types are INVALID_CONFIG.
func ParseConfig(raw json.RawMessage) (Config, error) {
	var c Config
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return c, nil
	}
	if err := strictDecode(raw, &c); err != nil {
		return Config{}, errorf(CodeInvalidConfig, "the state configuration is invalid: %v (keys: adapter, triggers_enabled, max_value_bytes, save_interval_ms)", err)
	}
	if c.MaxValueBytes != nil && *c.MaxValueBytes <= 0 {
		c.MaxValueBytes = nil
	}
	if c.SaveIntervalMS != nil && !saveIntervalOK(*c.SaveIntervalMS) {
		c.SaveIntervalMS = nil
	}
	if c.Adapter != nil {
		switch c.Adapter.Name {
		case "kv":
			if _, err := c.kv(); err != nil {
				return Config{}, err
			}
		case "redis":
			var r RedisConfig
			if len(c.Adapter.Config) > 0 && !bytes.Equal(c.Adapter.Config, []byte("null")) {
				if err := strictDecode(c.Adapter.Config, &r); err != nil {
					return Config{}, errorf(CodeInvalidConfig, "adapter redis: config: %v (keys: redis_url)", err)
				}
			}
		default:
			return Config{}, errorf(CodeInvalidConfig, "adapter %q is not one of kv, redis", c.Adapter.Name)
		}
	}
	return c, nil
}

func saveIntervalOK(ms int64) bool {
	return ms >= MinSaveInterval.Milliseconds() && ms <= MaxSaveInterval.Milliseconds()
}

func (c Config) kv() (KVConfig, error) {
	var k KVConfig
	if c.Adapter == nil || len(c.Adapter.Config) == 0 || bytes.Equal(c.Adapter.Config, []byte("null")) {
		return k, nil
	}
	if err := strictDecode(c.Adapter.Config, &k); err != nil {
		return k, errorf(CodeInvalidConfig, "adapter kv: config: %v (keys: store_method, file_path, save_interval_ms)", err)
	}
	switch k.StoreMethod {
	case "", "in_memory", "file_based":
	default:
		return k, errorf(CodeInvalidConfig, "adapter kv: store_method %q is not in_memory or file_based", k.StoreMethod)
	}
	return k, nil
}

// TriggersOn reports triggers_enabled (default true).
func (c Config) TriggersOn() bool { return c.TriggersEnabled == nil || *c.TriggersEnabled }

// ValueLimit is max_value_bytes, 0 for none.
func (c Config) ValueLimit() int64 {
	if c.MaxValueBytes == nil {
		return 0
	}
	return *c.MaxValueBytes
}

// Store resolves the adapter: base anchors a relative kv file_path (the
// compose file's directory, as upstream anchors it to III_COMPOSE_DIR).
// Without an adapter the store is kv in memory, upstream's KvAdapterConfig
// default; the registry seed asks for file_based.
func (c Config) Store(base string) (StoreSpec, error) {
	s := StoreSpec{Adapter: "kv", SaveInterval: DefaultSaveInterval}
	name := "kv"
	if c.Adapter != nil {
		name = c.Adapter.Name
	}
	switch name {
	case "kv":
		k, err := c.kv()
		if err != nil {
			return s, err
		}
		if k.SaveIntervalMS != nil && saveIntervalOK(*k.SaveIntervalMS) {
			s.SaveInterval = time.Duration(*k.SaveIntervalMS) * time.Millisecond
		}
		if k.StoreMethod == "file_based" {
			s.Persist = true
			s.Dir = k.FilePath
			if s.Dir == "" {
				s.Dir = DefaultFilePath
			}
			if !filepath.IsAbs(s.Dir) {
				s.Dir = filepath.Join(base, s.Dir)
			}
		}
	case "redis":
		var r RedisConfig
		if c.Adapter != nil && len(c.Adapter.Config) > 0 && !bytes.Equal(c.Adapter.Config, []byte("null")) {
			if err := strictDecode(c.Adapter.Config, &r); err != nil {
				return s, errorf(CodeInvalidConfig, "adapter redis: config: %v", err)
			}
		}
		s.Adapter, s.RedisURL = "redis", r.RedisURL
		if s.RedisURL == "" {
			s.RedisURL = DefaultRedisURL
		}
	default:
		return s, errorf(CodeInvalidConfig, "adapter %q is not one of kv, redis", name)
	}
	// The top-level save_interval_ms wins over the adapter's (upstream
	// folds it into the adapter config).
	if c.SaveIntervalMS != nil {
		s.SaveInterval = time.Duration(*c.SaveIntervalMS) * time.Millisecond
	}
	return s, nil
}

// Schema is the configuration entry's JSON Schema.
const Schema = `{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "adapter": {
      "description": "Storage adapter (restart to change): kv (in_memory or file_based) or redis.",
      "oneOf": [
        {"title": "kv", "type": "object", "required": ["name"], "additionalProperties": false,
         "properties": {"name": {"enum": ["kv"]}, "config": {"type": "object", "additionalProperties": false,
           "properties": {"store_method": {"enum": ["in_memory", "file_based"]}, "file_path": {"type": "string"},
             "save_interval_ms": {"type": "integer", "minimum": 100, "maximum": 3600000}}}}},
        {"title": "redis", "type": "object", "required": ["name"], "additionalProperties": false,
         "properties": {"name": {"enum": ["redis"]}, "config": {"type": "object", "additionalProperties": false,
           "properties": {"redis_url": {"type": "string"}}}}}
      ]
    },
    "triggers_enabled": {"type": "boolean", "description": "State change triggers fire (applied live; default true)."},
    "max_value_bytes": {"type": "integer", "minimum": 1, "description": "state::set refuses larger values with VALUE_TOO_LARGE (applied live; unset: no limit)."},
    "save_interval_ms": {"type": "integer", "minimum": 100, "maximum": 3600000, "description": "How often the file_based kv store is saved (default 5000)."}
  }
}`

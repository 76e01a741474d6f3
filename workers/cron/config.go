package cron

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/iii-sandbox/iii/protocol"
)

// Version is the cron package this worker is published as: 0.21.26, the
// last release of upstream's trigger-type generation (trigger type
// `cron`); 0.22.2 moved to the observer generation (cron::on-tick), which
// this worker does not serve.
const Version = "0.21.26"

// Name is the worker's (and the package's) name: its configuration entry
// and function prefix.
const Name = "cron"

// TriggerType is the trigger type the worker provides.
const TriggerType = "cron"

// Defaults of the configuration.
const (
	DefaultLockDir  = "data/cron"
	DefaultRedisURL = "redis://localhost:6379"
)

// DefaultConfig is the registry seed, the package's default
// configuration.
const DefaultConfig = `{"adapter":{"name":"local"}}`

// Error codes.
const (
	// CodeInvalidCronExpression refuses a trigger whose expression is
	// missing or does not parse (the observer generation's code, given to
	// the trigger generation's messages too).
	CodeInvalidCronExpression = "INVALID_CRON_EXPRESSION"
	// CodeAlreadyRegistered refuses a second, different trigger under an
	// id already scheduled.
	CodeAlreadyRegistered = "TRIGGER_ALREADY_REGISTERED"
	// CodeInvalidConfig is a configuration the worker cannot run with.
	CodeInvalidConfig = "INVALID_CONFIG"
	// CodeLockUnavailable: the lock cannot be opened at start.
	CodeLockUnavailable = "LOCK_UNAVAILABLE"
)

// errorf is an error with code whose message starts with the code
// (docs/standard-workers.md, "Errors").
func errorf(code, format string, args ...any) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: code, Message: code + ": " + fmt.Sprintf(format, args...)}
}

// Config is the worker's configuration entry. Unknown keys are refused.
type Config struct {
	Adapter *AdapterConfig `json:"adapter,omitempty"`
}

// AdapterConfig selects the lock: local (default) or redis.
type AdapterConfig struct {
	Name   string          `json:"name"`
	Config json.RawMessage `json:"config,omitempty"`
}

// LocalConfig is the local adapter's config.
type LocalConfig struct {
	// LockDir is the directory the project's cron workers share
	// (relative to the compose file's directory).
	LockDir string `json:"lock_dir,omitempty"`
}

// RedisConfig is the redis adapter's config.
type RedisConfig struct {
	RedisURL string `json:"redis_url,omitempty"`
}

// LockSpec is what the adapter part of a configuration resolves to.
type LockSpec struct {
	Adapter  string // local | redis
	Dir      string // local: absolute
	RedisURL string
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

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// ParseConfig reads a configuration value (null or empty: the defaults).
func ParseConfig(raw json.RawMessage) (Config, error) {
	var c Config
	if isNull(raw) {
		return c, nil
	}
	if err := strictDecode(raw, &c); err != nil {
		return Config{}, errorf(CodeInvalidConfig, "the cron configuration is invalid: %v (keys: adapter)", err)
	}
	if _, err := c.Lock(""); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Lock resolves the adapter; base anchors a relative lock_dir.
func (c Config) Lock(base string) (LockSpec, error) {
	name := "local"
	var sub json.RawMessage
	if c.Adapter != nil {
		name, sub = c.Adapter.Name, c.Adapter.Config
	}
	switch name {
	case "local", "":
		var l LocalConfig
		if !isNull(sub) {
			if err := strictDecode(sub, &l); err != nil {
				return LockSpec{}, errorf(CodeInvalidConfig, "adapter local: config: %v (keys: lock_dir)", err)
			}
		}
		dir := l.LockDir
		if dir == "" {
			dir = DefaultLockDir
		}
		if !filepath.IsAbs(dir) && base != "" {
			dir = filepath.Join(base, dir)
		}
		return LockSpec{Adapter: "local", Dir: dir}, nil
	case "redis":
		var r RedisConfig
		if !isNull(sub) {
			if err := strictDecode(sub, &r); err != nil {
				return LockSpec{}, errorf(CodeInvalidConfig, "adapter redis: config: %v (keys: redis_url)", err)
			}
		}
		if r.RedisURL == "" {
			r.RedisURL = DefaultRedisURL
		}
		return LockSpec{Adapter: "redis", RedisURL: r.RedisURL}, nil
	default:
		return LockSpec{}, errorf(CodeInvalidConfig, "adapter %q is not one of local, redis", name)
	}
}

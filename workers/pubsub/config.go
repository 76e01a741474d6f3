package pubsub

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/iii-sandbox/iii/protocol"
)

// Version is the pubsub package this worker is published as: 0.21.14,
// upstream's last release of the worker before it was deprecated.
const Version = "0.21.14"

// Name is the worker's (and the package's) name: its configuration entry
// and the prefix of its reload hook.
const Name = "pubsub"

// Upstream's ids: a bare function id and a trigger type.
const (
	FunctionPublish = "publish"
	TriggerType     = "subscribe"
)

// DefaultConfig is the registry seed, the package's default configuration.
const DefaultConfig = `{"adapter":{"name":"local"}}`

// DefaultRedisURL is the redis adapter's default.
const DefaultRedisURL = "redis://localhost:6379"

// Error codes.
const (
	// CodeTopicNotSet refuses a publish without a topic (upstream's).
	CodeTopicNotSet = "topic_not_set"
	// CodeInvalidConfig is a configuration the worker cannot run with.
	CodeInvalidConfig = "INVALID_CONFIG"
	// CodeInvalidPublish is a publish payload that is not {topic, data}.
	CodeInvalidPublish = "INVALID_PUBLISH"
)

func errorf(code, format string, args ...any) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Config is the worker's configuration entry. Unknown keys are refused.
type Config struct {
	Adapter *AdapterConfig `json:"adapter,omitempty"`
}

// AdapterConfig selects the broker: local (default: this worker's own
// subscribers) or redis (every pubsub worker on the same Redis).
type AdapterConfig struct {
	Name   string          `json:"name"`
	Config json.RawMessage `json:"config,omitempty"`
}

// BrokerSpec is what the adapter part of a configuration resolves to.
type BrokerSpec struct {
	Adapter  string // local | redis
	RedisURL string
}

// ParseConfig reads a configuration value (null or empty: the defaults).
func ParseConfig(raw json.RawMessage) (Config, BrokerSpec, error) {
	var c Config
	if !isNull(raw) {
		if err := strictDecode(raw, &c); err != nil {
			return Config{}, BrokerSpec{}, errorf(CodeInvalidConfig, "the pubsub configuration is invalid: %v (keys: adapter)", err)
		}
	}
	name := "local"
	var sub json.RawMessage
	if c.Adapter != nil {
		name, sub = c.Adapter.Name, c.Adapter.Config
	}
	switch name {
	case "local", "":
		if !isNull(sub) && !bytes.Equal(bytes.TrimSpace(sub), []byte("{}")) {
			return Config{}, BrokerSpec{}, errorf(CodeInvalidConfig, "adapter local takes no config, got %s", sub)
		}
		return c, BrokerSpec{Adapter: "local"}, nil
	case "redis":
		var r struct {
			RedisURL string `json:"redis_url,omitempty"`
		}
		if !isNull(sub) {
			if err := strictDecode(sub, &r); err != nil {
				return Config{}, BrokerSpec{}, errorf(CodeInvalidConfig, "adapter redis: config: %v (keys: redis_url)", err)
			}
		}
		if r.RedisURL == "" {
			r.RedisURL = DefaultRedisURL
		}
		return c, BrokerSpec{Adapter: "redis", RedisURL: r.RedisURL}, nil
	default:
		return Config{}, BrokerSpec{}, errorf(CodeInvalidConfig, "adapter %q is not one of local, redis", name)
	}
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

package queue

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/protocol"
)

// Version is the queue package this worker is published as: 0.21.26, the
// last release of upstream's trigger-type generation (trigger type
// `durable:subscriber`); 0.22.3 moved subscribers to the observer
// generation (queue::on-message), which this worker does not serve.
const Version = "0.21.26"

// Name is the worker's (and the package's) name: its configuration entry
// and function prefix.
const Name = "queue"

// TriggerType is the trigger type the worker provides.
const TriggerType = "durable:subscriber"

// DefaultConfig is the registry seed, the package's default configuration.
const DefaultConfig = `{"adapter":{"name":"builtin","config":{"store_method":"file_based","file_path":"data/queue"}}}`

// Defaults (upstream's).
const (
	DefaultFilePath      = "data/queue"
	DefaultMaxRetries    = 3
	DefaultBackoffMS     = 1000
	DefaultConcurrency   = 10
	DefaultTimeoutMS     = 30 * 60 * 1000
	DefaultSaveInterval  = 5000
	DefaultPollInterval  = 100
	maxBackoffMS         = int64(24 * time.Hour / time.Millisecond)
	maxRetriesLimit      = 1000
	maxConcurrency       = 10000
	maxQueueNameLen      = 256
	subscriberRetention  = 30 * time.Second
	notReadyRetry        = time.Second
	maxDLQPage           = 1000
	defaultDLQPage       = 50
	storeMethodFile      = "file_based"
	storeMethodInMemory  = "in_memory"
	queueTypeStandard    = "standard"
	queueTypeFIFO        = "fifo"
	subscriberConcurrent = "concurrent"
)

// Error codes (docs/standard-workers.md, "queue").
const (
	CodeInvalidConfig     = "INVALID_CONFIG"
	CodeInvalidArgument   = "INVALID_ARGUMENT"
	CodeTopicNotSet       = "topic_not_set"
	CodeNotProvisioned    = "QUEUE_NOT_PROVISIONED"
	CodeMessageNotFound   = "MESSAGE_NOT_FOUND"
	CodeAlreadyRegistered = "TRIGGER_ALREADY_REGISTERED"
	CodeStoreFailed       = "STORE_FAILED"
	CodeStoreUnavailable  = "STORE_UNAVAILABLE"
)

// errorf is an error with code whose message starts with the code
// (docs/standard-workers.md, "Errors").
func errorf(code, format string, args ...any) *protocol.ErrorBody {
	return &protocol.ErrorBody{Code: code, Message: code + ": " + fmt.Sprintf(format, args...)}
}

// Config is the worker's configuration. Unknown keys are refused.
type Config struct {
	Adapter      *AdapterConfig         `json:"adapter,omitempty"`
	QueueConfigs map[string]QueueConfig `json:"queue_configs,omitempty"`
}

// AdapterConfig selects the store: builtin (file_based or in_memory).
type AdapterConfig struct {
	Name   string          `json:"name"`
	Config json.RawMessage `json:"config,omitempty"`
}

// BuiltinConfig is the builtin adapter's config.
type BuiltinConfig struct {
	StoreMethod    string `json:"store_method,omitempty"`
	FilePath       string `json:"file_path,omitempty"`
	SaveIntervalMS *int64 `json:"save_interval_ms,omitempty"`
}

// StoreSpec is where the worker keeps its messages.
type StoreSpec struct {
	Dir          string        // file_based; "" with no RedisURL = in memory
	RedisURL     string        // the redis adapter
	RedisPrefix  string        // its keys' prefix
	SaveInterval time.Duration // how often the log is fsynced
}

// RedisConfig is the redis adapter's config.
type RedisConfig struct {
	RedisURL  string `json:"redis_url,omitempty"`
	KeyPrefix string `json:"key_prefix,omitempty"`
}

// decodeStrict decodes raw into v refusing unknown keys; what names the
// object in the error.
func decodeStrict(raw json.RawMessage, v any, what string) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errorf(CodeInvalidConfig, "%s: %v", what, err)
	}
	return nil
}

// ParseConfig reads the configuration (nil or null is the default one).
func ParseConfig(raw json.RawMessage) (Config, error) {
	var c Config
	if err := decodeStrict(raw, &c, "queue configuration"); err != nil {
		return Config{}, err
	}
	for name, q := range c.QueueConfigs {
		if err := checkQueueName(name); err != nil {
			return Config{}, errorf(CodeInvalidConfig, "queue_configs: %v", err)
		}
		n, err := q.normalize()
		if err != nil {
			return Config{}, errorf(CodeInvalidConfig, "queue_configs.%s: %v", name, err)
		}
		c.QueueConfigs[name] = n
	}
	if _, err := c.Store(""); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Store is the store the configuration names; relative paths are under
// base (the compose file's directory).
func (c Config) Store(base string) (StoreSpec, error) {
	name := "builtin"
	var raw json.RawMessage
	if c.Adapter != nil {
		name, raw = strings.TrimSpace(c.Adapter.Name), c.Adapter.Config
	}
	switch name {
	case "builtin", "":
	case "redis":
		var rc RedisConfig
		if err := decodeStrict(raw, &rc, "adapter.config"); err != nil {
			return StoreSpec{}, err
		}
		spec := StoreSpec{RedisURL: rc.RedisURL, RedisPrefix: rc.KeyPrefix, SaveInterval: DefaultSaveInterval * time.Millisecond}
		if strings.TrimSpace(spec.RedisURL) == "" {
			spec.RedisURL = DefaultRedisURL
		}
		if spec.RedisPrefix == "" {
			spec.RedisPrefix = DefaultRedisPrefix
		}
		return spec, nil
	case "rabbitmq":
		return StoreSpec{}, errorf(CodeInvalidConfig, "adapter %q is not implemented by this queue worker; use builtin (store_method file_based or in_memory) or redis", name)
	default:
		return StoreSpec{}, errorf(CodeInvalidConfig, "unknown adapter %q (builtin, redis)", name)
	}
	var b BuiltinConfig
	if err := decodeStrict(raw, &b, "adapter.config"); err != nil {
		return StoreSpec{}, err
	}
	spec := StoreSpec{SaveInterval: DefaultSaveInterval * time.Millisecond}
	if b.SaveIntervalMS != nil {
		if *b.SaveIntervalMS < 1 || *b.SaveIntervalMS > 3_600_000 {
			return StoreSpec{}, errorf(CodeInvalidConfig, "adapter.config.save_interval_ms %d is out of range (1 to 3600000)", *b.SaveIntervalMS)
		}
		spec.SaveInterval = time.Duration(*b.SaveIntervalMS) * time.Millisecond
	}
	switch b.StoreMethod {
	case "", storeMethodFile:
		p := b.FilePath
		if strings.TrimSpace(p) == "" {
			p = DefaultFilePath
		}
		if !filepath.IsAbs(p) && base != "" {
			p = filepath.Join(base, p)
		}
		spec.Dir = p
	case storeMethodInMemory:
	default:
		return StoreSpec{}, errorf(CodeInvalidConfig, "adapter.config.store_method %q is not file_based or in_memory", b.StoreMethod)
	}
	return spec, nil
}

// QueueConfig is a named function queue's configuration (upstream's
// FunctionQueueConfig). Unknown keys are refused.
type QueueConfig struct {
	MaxRetries               *int   `json:"max_retries,omitempty"`
	Concurrency              *int   `json:"concurrency,omitempty"`
	TimeoutMS                *int64 `json:"timeout_ms,omitempty"`
	Type                     string `json:"type,omitempty"`
	MessageGroupField        string `json:"message_group_field,omitempty"`
	BackoffMS                *int64 `json:"backoff_ms,omitempty"`
	PollIntervalMS           *int64 `json:"poll_interval_ms,omitempty"`
	RedeliverOnEngineRestart bool   `json:"redeliver_on_engine_restart,omitempty"`
	MaxPriority              *int   `json:"max_priority,omitempty"`
	PriorityField            string `json:"priority_field,omitempty"`
}

// normalize fills the defaults in and checks the ranges.
func (q QueueConfig) normalize() (QueueConfig, error) {
	setInt := func(p **int, def int) {
		if *p == nil {
			v := def
			*p = &v
		}
	}
	setInt64 := func(p **int64, def int64) {
		if *p == nil {
			v := def
			*p = &v
		}
	}
	setInt(&q.MaxRetries, DefaultMaxRetries)
	setInt(&q.Concurrency, DefaultConcurrency)
	setInt64(&q.TimeoutMS, DefaultTimeoutMS)
	setInt64(&q.BackoffMS, DefaultBackoffMS)
	setInt64(&q.PollIntervalMS, DefaultPollInterval)
	if q.Type == "" {
		q.Type = queueTypeStandard
	}
	switch {
	case *q.MaxRetries < 0 || *q.MaxRetries > maxRetriesLimit:
		return q, fmt.Errorf("max_retries %d is out of range (0 to %d)", *q.MaxRetries, maxRetriesLimit)
	case *q.Concurrency < 1 || *q.Concurrency > maxConcurrency:
		return q, fmt.Errorf("concurrency %d is out of range (1 to %d)", *q.Concurrency, maxConcurrency)
	case *q.TimeoutMS < 1 || *q.TimeoutMS > maxBackoffMS:
		return q, fmt.Errorf("timeout_ms %d is out of range (1 to %d)", *q.TimeoutMS, maxBackoffMS)
	case *q.BackoffMS < 0 || *q.BackoffMS > maxBackoffMS:
		return q, fmt.Errorf("backoff_ms %d is out of range (0 to %d)", *q.BackoffMS, maxBackoffMS)
	case *q.PollIntervalMS < 1:
		return q, fmt.Errorf("poll_interval_ms %d must be at least 1", *q.PollIntervalMS)
	case q.Type != queueTypeStandard && q.Type != queueTypeFIFO:
		return q, fmt.Errorf("type %q is not standard or fifo", q.Type)
	case q.Type == queueTypeFIFO && strings.TrimSpace(q.MessageGroupField) == "":
		return q, fmt.Errorf("a fifo queue needs message_group_field (the data field whose value orders messages)")
	}
	return q, nil
}

// ParseQueueConfig reads one queue's configuration (queue::define).
func ParseQueueConfig(raw json.RawMessage) (QueueConfig, error) {
	var q QueueConfig
	if err := decodeStrict(raw, &q, "queue config"); err != nil {
		return QueueConfig{}, err
	}
	n, err := q.normalize()
	if err != nil {
		return QueueConfig{}, errorf(CodeInvalidConfig, "%v", err)
	}
	return n, nil
}

var queueNameRE = regexp.MustCompile(`^[^\x00-\x1f\x7f]+$`)

// checkQueueName refuses an empty or unprintable name.
func checkQueueName(name string) error {
	if strings.TrimSpace(name) == "" {
		return fmt.Errorf("the queue name is empty")
	}
	if len(name) > maxQueueNameLen || !queueNameRE.MatchString(name) {
		return fmt.Errorf("queue name %q is not 1 to %d printable characters", clip(name), maxQueueNameLen)
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// SubscriberConfig is a durable:subscriber trigger's config (upstream's;
// queue_config accepts camelCase or snake_case keys).
type SubscriberConfig struct {
	Queue       string `json:"queue"`
	MaxRetries  int    `json:"max_retries"`
	BackoffMS   int64  `json:"backoff_ms"`
	Condition   string `json:"condition_function_id,omitempty"`
	Group       string `json:"group,omitempty"`
	Type        string `json:"type"` // concurrent | fifo
	Concurrency int    `json:"concurrency"`
}

// ParseSubscriber reads a durable:subscriber trigger's config.
func ParseSubscriber(raw json.RawMessage) (SubscriberConfig, error) {
	var in map[string]json.RawMessage
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &in) != nil {
		return SubscriberConfig{}, errorf(CodeInvalidConfig, "a durable:subscriber trigger needs an object config {queue, max_retries?, backoff_ms?, condition_function_id?, group?, queue_config?}")
	}
	s := SubscriberConfig{MaxRetries: DefaultMaxRetries, BackoffMS: DefaultBackoffMS, Type: subscriberConcurrent, Concurrency: DefaultConcurrency}
	str := func(key string, dst *string) error {
		v, ok := in[key]
		if !ok || bytes.Equal(v, []byte("null")) {
			return nil
		}
		if json.Unmarshal(v, dst) != nil {
			return errorf(CodeInvalidConfig, "durable:subscriber %s must be a string", key)
		}
		return nil
	}
	num := func(m map[string]json.RawMessage, keys []string, dst *int64, lo, hi int64) error {
		for _, key := range keys {
			v, ok := m[key]
			if !ok || bytes.Equal(v, []byte("null")) {
				continue
			}
			var n int64
			if json.Unmarshal(v, &n) != nil || n < lo || n > hi {
				return errorf(CodeInvalidConfig, "durable:subscriber %s must be an integer from %d to %d, not %s", key, lo, hi, clip(string(v)))
			}
			*dst = n
		}
		return nil
	}
	if err := str("topic", &s.Queue); err != nil {
		return s, err
	}
	if err := str("queue", &s.Queue); err != nil {
		return s, err
	}
	if strings.TrimSpace(s.Queue) == "" {
		return s, errorf(CodeInvalidConfig, "durable:subscriber needs a non-empty queue (or topic)")
	}
	if err := checkQueueName(s.Queue); err != nil {
		return s, errorf(CodeInvalidConfig, "durable:subscriber: %v", err)
	}
	if err := str("condition_function_id", &s.Condition); err != nil {
		return s, err
	}
	if err := str("group", &s.Group); err != nil {
		return s, err
	}
	mr, bo := int64(s.MaxRetries), s.BackoffMS
	if err := num(in, []string{"max_retries"}, &mr, 0, maxRetriesLimit); err != nil {
		return s, err
	}
	if err := num(in, []string{"backoff_ms"}, &bo, 0, maxBackoffMS); err != nil {
		return s, err
	}
	if qc, ok := in["queue_config"]; ok && !bytes.Equal(qc, []byte("null")) {
		var q map[string]json.RawMessage
		if json.Unmarshal(qc, &q) != nil {
			return s, errorf(CodeInvalidConfig, "durable:subscriber queue_config must be an object")
		}
		if v, ok := q["type"]; ok {
			if json.Unmarshal(v, &s.Type) != nil || (s.Type != subscriberConcurrent && s.Type != queueTypeFIFO && s.Type != queueTypeStandard) {
				return s, errorf(CodeInvalidConfig, "durable:subscriber queue_config.type must be concurrent or fifo, not %s", clip(string(v)))
			}
			if s.Type == queueTypeStandard {
				s.Type = subscriberConcurrent
			}
		}
		if err := num(q, []string{"maxRetries", "max_retries"}, &mr, 0, maxRetriesLimit); err != nil {
			return s, err
		}
		if err := num(q, []string{"backoffDelayMs", "backoff_delay_ms", "backoff_ms"}, &bo, 0, maxBackoffMS); err != nil {
			return s, err
		}
		conc := int64(s.Concurrency)
		if err := num(q, []string{"concurrency"}, &conc, 0, maxConcurrency); err != nil {
			return s, err
		}
		s.Concurrency = int(conc)
		known := map[string]bool{"type": true, "maxRetries": true, "max_retries": true, "backoffDelayMs": true, "backoff_delay_ms": true,
			"backoff_ms": true, "concurrency": true, "maxPriority": true, "max_priority": true, "visibilityTimeout": true,
			"visibility_timeout": true, "delaySeconds": true, "delay_seconds": true, "backoffType": true, "backoff_type": true}
		var unknown []string
		for k := range q {
			if !known[k] {
				unknown = append(unknown, k)
			}
		}
		if len(unknown) > 0 {
			sort.Strings(unknown)
			return s, errorf(CodeInvalidConfig, "durable:subscriber queue_config has unknown keys %s", strings.Join(unknown, ", "))
		}
	}
	s.MaxRetries, s.BackoffMS = int(mr), bo
	return s, nil
}

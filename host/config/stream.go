package config

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/internal/yamlnode"
)

// Defaults of the iii-stream worker (docs/stream.md). The host differs
// from upstream's 0.0.0.0 on purpose: the stream socket is served to every
// local process, and beyond loopback to the network, so widening it must
// be written down.
const (
	DefaultStreamHost         = "127.0.0.1"
	DefaultStreamPort         = 3112
	DefaultStreamAdapter      = "kv"
	DefaultStreamFilePath     = "./data/stream_store"
	DefaultStreamSaveInterval = 5000 * time.Millisecond
	DefaultStreamChannelSize  = 256
	// DefaultStreamRedisURL is the redis adapter's redis_url when none is
	// given (upstream's).
	DefaultStreamRedisURL = "redis://localhost:6379"

	// StreamAdapterRedis keeps the streams in Redis, shared by every
	// engine (this one's or upstream's) on it.
	StreamAdapterRedis = "redis"

	// StoreFileBased persists the kv store under FilePath; StoreInMemory
	// keeps it for the engine's lifetime only.
	StoreFileBased = "file_based"
	StoreInMemory  = "in_memory"

	minStreamSaveMS     = 100
	maxStreamSaveMS     = 3_600_000
	maxStreamChannelCap = 1_048_576
)

// Stream is the iii-stream worker's settings. It is comparable, so a reload
// sees any change as a changed worker.
type Stream struct {
	Name string // the worker entry's name, e.g. "iii-stream"
	Host string
	Port int // 0 lets the system pick a free port
	// AuthFunction is auth_function: called at each WebSocket upgrade; ""
	// lets every client in.
	AuthFunction string
	Adapter      string // DefaultStreamAdapter ("kv") or StreamAdapterRedis
	// RedisURL is the redis adapter's Redis (with Adapter "redis" only).
	// It may hold a password: never print it as it is.
	RedisURL string
	// RedisURLAsWritten is redis_url as config.yaml writes it when it
	// holds ${...} placeholders ("" otherwise): the entry is seeded with
	// it, so a password given as ${VAR} never reaches the entry's file.
	RedisURLAsWritten string
	StoreMethod       string // StoreFileBased or StoreInMemory
	// FilePath is the kv store's directory (absolute); used when
	// StoreMethod is StoreFileBased.
	FilePath     string
	SaveInterval time.Duration
	ChannelSize  int
}

// Addr is host:port for net.Listen.
func (s Stream) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// stream reads an iii-stream entry. prev is the entry already read, if any:
// the worker serves stream::* in the default namespace, so there is one.
func (p *parser) stream(e entry, prev *Stream) (*Stream, error) {
	if prev != nil {
		return nil, p.fail(CodeInvalidConfig, e.nameNode, "a second iii-stream worker (%s; the first is %s): there is one stream worker, it serves stream::* in the default namespace", e.Name, prev.Name)
	}
	s := &Stream{Name: e.Name, Host: DefaultStreamHost, Port: DefaultStreamPort, Adapter: DefaultStreamAdapter,
		StoreMethod: StoreFileBased, FilePath: p.resolve(DefaultStreamFilePath),
		SaveInterval: DefaultStreamSaveInterval, ChannelSize: DefaultStreamChannelSize}
	path := e.Name + ".config"
	fields, err := p.mapping(e.configNode, path, "port", "host", "auth_function", "adapter")
	if err != nil {
		return nil, err
	}
	if v := fields["host"]; !yamlnode.IsNull(v) {
		h, err := p.stringValue(v, path+".host")
		if err != nil {
			return nil, err
		}
		if !validHost(h) {
			return nil, p.fail(CodeInvalidConfig, v, "%s.host %q is not an IP address or host name", path, h)
		}
		s.Host = h
	}
	if v := fields["port"]; !yamlnode.IsNull(v) {
		port, err := p.intValue(v, path+".port", 0, 65535)
		if err != nil {
			return nil, err
		}
		s.Port = int(port)
	}
	if v := fields["auth_function"]; !yamlnode.IsNull(v) {
		id, err := p.stringValue(v, path+".auth_function")
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(id) == "" {
			return nil, p.fail(CodeInvalidConfig, v, "%s.auth_function is blank; name a function or leave the key out", path)
		}
		s.AuthFunction = id
	}
	adapter, err := p.mapping(fields["adapter"], path+".adapter", "name", "config")
	if err != nil {
		return nil, err
	}
	if v := adapter["name"]; !yamlnode.IsNull(v) {
		name, err := p.stringValue(v, path+".adapter.name")
		if err != nil {
			return nil, err
		}
		switch name {
		case DefaultStreamAdapter, StreamAdapterRedis:
			s.Adapter = name
		case "bridge":
			return nil, p.fail(CodeInvalidConfig, v, "%s.adapter.name \"bridge\" is not supported: it forwards stream pub/sub to a pub/sub worker on a remote engine, which this engine does not have; use kv (the built-in store) or redis (several engines on one Redis)", path)
		default:
			return nil, p.fail(CodeInvalidConfig, v, "%s.adapter.name %q is not a stream adapter; use kv (the built-in store) or redis (several engines on one Redis)", path, name)
		}
	}
	if s.Adapter == StreamAdapterRedis {
		rc, err := p.mapping(adapter["config"], path+".adapter.config", "redis_url")
		if err != nil {
			return nil, err
		}
		s.RedisURL = DefaultStreamRedisURL
		if v := rc["redis_url"]; !yamlnode.IsNull(v) {
			u, err := p.stringValue(v, path+".adapter.config.redis_url")
			if err != nil {
				return nil, err
			}
			if why := checkRedisURL(u); why != "" {
				// Not quoted: it may hold a password.
				return nil, p.fail(CodeInvalidConfig, v, "%s.adapter.config.redis_url %s", path, why)
			}
			s.RedisURL = u
			s.RedisURLAsWritten = p.written[v]
		}
		return s, nil
	}
	kv, err := p.mapping(adapter["config"], path+".adapter.config", "store_method", "file_path", "save_interval_ms", "channel_size")
	if err != nil {
		return nil, err
	}
	if v := kv["store_method"]; !yamlnode.IsNull(v) {
		m, err := p.stringValue(v, path+".adapter.config.store_method")
		if err != nil {
			return nil, err
		}
		if m != StoreFileBased && m != StoreInMemory {
			return nil, p.fail(CodeInvalidConfig, v, "%s.adapter.config.store_method %q is not file_based or in_memory", path, m)
		}
		s.StoreMethod = m
	}
	if v := kv["file_path"]; !yamlnode.IsNull(v) {
		dir, err := p.stringValue(v, path+".adapter.config.file_path")
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(dir) == "" {
			return nil, p.fail(CodeInvalidConfig, v, "%s.adapter.config.file_path is blank; leave it out for %s", path, DefaultStreamFilePath)
		}
		s.FilePath = p.resolve(dir)
	}
	if v := kv["save_interval_ms"]; !yamlnode.IsNull(v) {
		ms, err := p.intValue(v, path+".adapter.config.save_interval_ms", minStreamSaveMS, maxStreamSaveMS)
		if err != nil {
			return nil, err
		}
		s.SaveInterval = time.Duration(ms) * time.Millisecond
	}
	if v := kv["channel_size"]; !yamlnode.IsNull(v) {
		n, err := p.intValue(v, path+".adapter.config.channel_size", 1, maxStreamChannelCap)
		if err != nil {
			return nil, err
		}
		s.ChannelSize = int(n)
	}
	return s, nil
}

// checkRedisURL says what is wrong with a redis_url ("" when nothing is):
// redis://[user:password@]host[:port][/db], rediss://… (TLS) or
// unix:///path/to/socket.
func checkRedisURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "is not a URL" // err quotes the URL, password and all
	}
	switch u.Scheme {
	case "redis", "rediss":
		if u.Host == "" {
			return "names no host; write redis://host:6379"
		}
	case "unix":
		if u.Path == "" {
			return "names no socket; write unix:///path/to/redis.sock"
		}
	default:
		return "is not a redis://, rediss:// or unix:// URL"
	}
	return ""
}

// checkStreamClash refuses an iii-stream port that a listener also binds.
func (p *parser) checkStreamClash(cfg *Config, entries []entry) error {
	s := cfg.Stream
	if s == nil || s.Port == 0 {
		return nil
	}
	for _, l := range cfg.Listeners {
		if l.Port != s.Port {
			continue
		}
		if l.Host == s.Host || isWildcard(l.Host) || isWildcard(s.Host) {
			for _, e := range entries {
				if e.Name == s.Name {
					return p.fail(CodeInvalidConfig, e.nameNode, "%s and %s both listen on port %d (%s and %s); give the stream worker its own port (3112 by default)", l.Name, s.Name, s.Port, l.Host, s.Host)
				}
			}
		}
	}
	return nil
}

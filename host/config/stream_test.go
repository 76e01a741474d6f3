package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func TestParseStream(t *testing.T) {
	defaults := Stream{Name: "iii-stream", Host: "127.0.0.1", Port: 3112, Adapter: "kv", StoreMethod: StoreFileBased,
		FilePath: filepath.Join(testDir, "data", "stream_store"), SaveInterval: 5 * time.Second, ChannelSize: 256}
	tests := []struct {
		name string
		src  string
		env  map[string]string
		want Stream
	}{
		{name: "bare", src: "workers:\n  - name: iii-stream\n", want: defaults},
		{
			name: "upstream_guide",
			src:  "workers:\n  - name: iii-stream\n    config: { port: ${STREAM_PORT:3112}, host: 127.0.0.1 }\n",
			want: defaults,
		},
		{
			name: "port_from_env",
			src:  "workers:\n  - name: iii-stream\n    config: { port: ${STREAM_PORT:3112} }\n",
			env:  map[string]string{"STREAM_PORT": "4000"},
			want: func() Stream { s := defaults; s.Port = 4000; return s }(),
		},
		{
			name: "every_key",
			src: "workers:\n  - name: iii-stream\n    config:\n      port: 0\n      host: localhost\n      auth_function: onAuth\n" +
				"      adapter:\n        name: kv\n        config:\n          store_method: in_memory\n          file_path: /var/lib/streams\n          save_interval_ms: 250\n          channel_size: 1024\n",
			want: Stream{Name: "iii-stream", Host: "localhost", Port: 0, AuthFunction: "onAuth", Adapter: "kv", StoreMethod: StoreInMemory,
				FilePath: "/var/lib/streams", SaveInterval: 250 * time.Millisecond, ChannelSize: 1024},
		},
		{
			name: "redis",
			src:  "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis, config: { redis_url: 'redis://:pw@10.0.0.5:6380/2' } } }\n",
			want: func() Stream {
				s := defaults
				s.Adapter = "redis"
				s.RedisURL = "redis://:pw@10.0.0.5:6380/2"
				return s
			}(),
		},
		{
			name: "redis_default_url",
			src:  "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis } }\n",
			want: func() Stream { s := defaults; s.Adapter = "redis"; s.RedisURL = "redis://localhost:6379"; return s }(),
		},
		{
			name: "redis_url_from_env",
			src:  "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis, config: { redis_url: '${REDIS_URL:redis://localhost:6379}' } } }\n",
			env:  map[string]string{"REDIS_URL": "rediss://cache.internal:6380"},
			want: func() Stream {
				s := defaults
				s.Adapter = "redis"
				s.RedisURL = "rediss://cache.internal:6380"
				s.RedisURLAsWritten = "${REDIS_URL:redis://localhost:6379}"
				return s
			}(),
		},
		{
			name: "redis_unix_socket",
			src:  "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis, config: { redis_url: 'unix:///run/redis.sock' } } }\n",
			want: func() Stream { s := defaults; s.Adapter = "redis"; s.RedisURL = "unix:///run/redis.sock"; return s }(),
		},
		{
			name: "relative_file_path",
			src:  "workers:\n  - name: iii-stream#main\n    config: { adapter: { name: kv, config: { store_method: file_based, file_path: ./streams } } }\n",
			want: func() Stream {
				s := defaults
				s.Name = "iii-stream#main"
				s.FilePath = filepath.Join(testDir, "streams")
				return s
			}(),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, tc.src, tc.env)
			assert.NilError(t, err)
			assert.Assert(t, cfg.Stream != nil)
			assert.DeepEqual(t, *cfg.Stream, tc.want)
		})
	}

	t.Run("absent", func(t *testing.T) {
		cfg, err := parse(t, "workers: []\n", nil)
		assert.NilError(t, err)
		assert.Assert(t, cfg.Stream == nil)
	})
}

func TestParseStreamErrors(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{name: "unknown_key", src: "workers:\n  - name: iii-stream\n    config: { prt: 1 }\n", want: `unknown key "prt"`},
		{name: "port_range", src: "workers:\n  - name: iii-stream\n    config: { port: 70000 }\n", want: "port is 70000"},
		{name: "port_string", src: "workers:\n  - name: iii-stream\n    config: { port: \"3112\" }\n", want: "whole number"},
		{name: "bad_host", src: "workers:\n  - name: iii-stream\n    config: { host: 'a b' }\n", want: "not an IP address"},
		{name: "blank_auth", src: "workers:\n  - name: iii-stream\n    config: { auth_function: ' ' }\n", want: "auth_function is blank"},
		{name: "bridge", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: bridge } }\n", want: `"bridge" is not supported: it forwards stream pub/sub to a pub/sub worker on a remote engine, which this engine does not have; use kv (the built-in store) or redis`},
		{name: "redis_kv_key", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis, config: { file_path: /x } } }\n", want: `unknown key "file_path"`},
		{name: "redis_url_key", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis, config: { url: 'redis://h' } } }\n", want: `unknown key "url"`},
		{name: "redis_url_scheme", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis, config: { redis_url: 'http://:s3cret@h:6379' } } }\n", want: "redis_url is not a redis://, rediss:// or unix:// URL"},
		{name: "redis_url_no_host", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis, config: { redis_url: 'redis://' } } }\n", want: "names no host"},
		{name: "redis_url_unparsable", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis, config: { redis_url: 'redis://:s3cret@h:port' } } }\n", want: "redis_url is not a URL"},
		{name: "redis_url_number", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: redis, config: { redis_url: 6379 } } }\n", want: "redis_url"},
		{name: "kv_redis_key", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: kv, config: { redis_url: 'redis://h' } } }\n", want: `unknown key "redis_url"`},
		{name: "unknown_adapter", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: postgres } }\n", want: "not a stream adapter"},
		{name: "adapter_unknown_key", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: kv, url: x } }\n", want: `unknown key "url"`},
		{name: "kv_unknown_key", src: "workers:\n  - name: iii-stream\n    config: { adapter: { name: kv, config: { bogus: 1 } } }\n", want: `unknown key "bogus"`},
		{name: "store_method", src: "workers:\n  - name: iii-stream\n    config: { adapter: { config: { store_method: weird } } }\n", want: "not file_based or in_memory"},
		{name: "blank_file_path", src: "workers:\n  - name: iii-stream\n    config: { adapter: { config: { file_path: '' } } }\n", want: "file_path is blank"},
		{name: "save_interval_low", src: "workers:\n  - name: iii-stream\n    config: { adapter: { config: { save_interval_ms: 5 } } }\n", want: "from 100 to 3600000"},
		{name: "channel_size_zero", src: "workers:\n  - name: iii-stream\n    config: { adapter: { config: { channel_size: 0 } } }\n", want: "from 1 to 1048576"},
		{name: "second_instance", src: "workers:\n  - name: iii-stream\n  - name: iii-stream#b\n", want: "a second iii-stream worker"},
		{name: "port_clash", src: "workers:\n  - name: iii-worker-manager\n    config: { port: 3112 }\n  - name: iii-stream\n", want: "both listen on port 3112"},
		{name: "port_clash_wildcard", src: "workers:\n  - name: iii-stream\n    config: { host: 0.0.0.0, port: 49134 }\n", want: "both listen on port 49134"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, tc.src, nil)
			assert.Assert(t, cfg == nil)
			var ce *Error
			assert.Assert(t, errors.As(err, &ce), "%v", err)
			assert.Equal(t, ce.Code, CodeInvalidConfig)
			assert.Assert(t, is.Contains(ce.Message, tc.want))
			assert.Assert(t, strings.HasPrefix(ce.Message, "config.yaml:"), ce.Message)
			assert.Assert(t, !strings.Contains(ce.Message, "s3cret"), "a redis_url's password is never quoted: %s", ce.Message)
		})
	}
}

package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// redisPrefix starts every key of the store: scope s is the hash
// "state:<s>" whose fields are the keys and whose values are JSON.
const redisPrefix = "state:"

// redisDialTimeout bounds the first answer at start.
const redisDialTimeout = 5 * time.Second

// maxUpdateRetries bounds an update that keeps losing its optimistic race.
const maxUpdateRetries = 64

type redisStore struct {
	c *redis.Client
}

var _ store = (*redisStore)(nil)

// redactURL hides a password for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}

func openRedis(ctx context.Context, rawURL string) (*redisStore, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, errorf(CodeInvalidConfig, "redis_url %s: %v", redactURL(rawURL), err)
	}
	opt.DisableIdentity = true
	c := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, redisDialTimeout)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, errorf(CodeStoreUnavailable, "redis at %s does not answer: %v", redactURL(rawURL), err)
	}
	return &redisStore{c: c}, nil
}

func hkey(scope string) string { return redisPrefix + scope }

func (s *redisStore) Get(ctx context.Context, scope, key string) (json.RawMessage, bool, error) {
	v, err := s.c.HGet(ctx, hkey(scope), key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if !json.Valid(v) {
		return nil, false, fmt.Errorf("redis hash %s field %q is not JSON", hkey(scope), key)
	}
	return v, true, nil
}

// oldOf reads the old value a script returned: false (Redis nil) is none.
func oldOf(v any) (json.RawMessage, bool) {
	s, ok := v.(string)
	if !ok {
		return nil, false
	}
	if !json.Valid([]byte(s)) {
		return json.RawMessage("null"), true // an unreadable old value is replaced; reported as null
	}
	return json.RawMessage(s), true
}

var setScript = redis.NewScript(`local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return old`)

var delScript = redis.NewScript(`local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
return old`)

func (s *redisStore) Set(ctx context.Context, scope, key string, value json.RawMessage) (json.RawMessage, bool, error) {
	v, err := setScript.Run(ctx, s.c, []string{hkey(scope)}, key, string(value)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, false, err
	}
	old, ok := oldOf(v)
	return old, ok, nil
}

func (s *redisStore) Delete(ctx context.Context, scope, key string) (json.RawMessage, bool, error) {
	v, err := delScript.Run(ctx, s.c, []string{hkey(scope)}, key).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, false, err
	}
	old, ok := oldOf(v)
	return old, ok, nil
}

// Update is optimistic: WATCH the hash, compute, write in MULTI; retried
// when another writer changed the hash meanwhile.
func (s *redisStore) Update(ctx context.Context, scope, key string, f func(json.RawMessage, bool) (json.RawMessage, error)) (json.RawMessage, bool, error) {
	k := hkey(scope)
	for range maxUpdateRetries {
		var old json.RawMessage
		var existed bool
		err := s.c.Watch(ctx, func(tx *redis.Tx) error {
			v, err := tx.HGet(ctx, k, key).Bytes()
			switch {
			case errors.Is(err, redis.Nil):
			case err != nil:
				return err
			case json.Valid(v):
				old, existed = v, true
			default:
				old, existed = json.RawMessage("null"), true
			}
			next, err := f(old, existed)
			if err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.HSet(ctx, k, key, string(next))
				return nil
			})
			return err
		}, k)
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		return old, existed, err
	}
	return nil, false, fmt.Errorf("the update lost its race with other writers %d times", maxUpdateRetries)
}

func (s *redisStore) Entries(ctx context.Context, scope string) ([]Entry, error) {
	m, err := s.c.HGetAll(ctx, hkey(scope)).Result()
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(m))
	for k, v := range m {
		if !json.Valid([]byte(v)) {
			return nil, fmt.Errorf("redis hash %s field %q is not JSON", hkey(scope), k)
		}
		out = append(out, Entry{k, json.RawMessage(v)})
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (s *redisStore) Scopes(ctx context.Context) ([]string, error) {
	var out []string
	it := s.c.Scan(ctx, 0, redisPrefix+"*", 512).Iterator()
	for it.Next(ctx) {
		out = append(out, strings.TrimPrefix(it.Val(), redisPrefix))
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func (s *redisStore) SetSaveInterval(time.Duration) {}

func (s *redisStore) Close(context.Context) error { return s.c.Close() }

// routeRedisLogs sends the redis client library's own log lines (its pool's
// dial retries) to log at debug level instead of raw to stderr. The
// library keeps one logger per process: Run, the binary's entry, sets it.
func routeRedisLogs(log hclog.Logger) {
	redis.SetLogger(redisLog{log.Named("redis")})
}

type redisLog struct{ log hclog.Logger }

func (l redisLog) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(strings.TrimSpace(fmt.Sprintf(format, v...)))
}

package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// Redis adapter: the same log, as a Redis list (<prefix>log, one record
// per element, appended with one RPUSH per write so a fan-out is all or
// none), held by one worker at a time through a lock key (<prefix>lock,
// renewed every lockRenew while the worker runs). Durability is Redis's
// (its appendonly/RDB settings).
const (
	DefaultRedisURL    = "redis://localhost:6379"
	DefaultRedisPrefix = "iii:queue:"
	redisDialTimeout   = 5 * time.Second
	lockTTL            = 30 * time.Second
	lockRenew          = 10 * time.Second
	// lockWait is how long open waits for a lock another worker holds
	// (one that died frees it within lockTTL).
	lockWait = lockTTL + 5*time.Second
)

var (
	renewScript   = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("pexpire", KEYS[1], ARGV[2]) else return 0 end`)
	releaseScript = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)
)

type redisSink struct {
	c      *redis.Client
	url    string
	prefix string
	token  string

	mu   sync.Mutex
	lost error // set when a renewal found the lock gone

	stop chan struct{}
	done chan struct{}
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	return u.Redacted()
}

// OpenRedisStore opens the log kept in Redis at rawURL under prefix.
func OpenRedisStore(ctx context.Context, rawURL, prefix string) (*Store, error) {
	k, err := openRedisSink(ctx, rawURL, prefix)
	if err != nil {
		return nil, err
	}
	return openSink(k)
}

func openRedisSink(ctx context.Context, rawURL, prefix string) (*redisSink, error) {
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
	var b [16]byte
	_, _ = rand.Read(b[:])
	k := &redisSink{c: c, url: redactURL(rawURL), prefix: prefix, token: hex.EncodeToString(b[:]),
		stop: make(chan struct{}), done: make(chan struct{})}
	deadline := time.Now().Add(lockWait)
	for {
		ok, err := c.SetNX(ctx, k.lockKey(), k.token, lockTTL).Result()
		if err != nil {
			_ = c.Close()
			return nil, errorf(CodeStoreUnavailable, "take the queue lock %s at %s: %v", k.lockKey(), k.url, err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			_ = c.Close()
			return nil, errorf(CodeStoreUnavailable, "another queue worker holds %s at %s: give each queue worker its own key_prefix", k.lockKey(), k.url)
		}
		select {
		case <-ctx.Done():
			_ = c.Close()
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	go k.renew()
	return k, nil
}

func (k *redisSink) lockKey() string { return k.prefix + "lock" }
func (k *redisSink) logKey() string  { return k.prefix + "log" }
func (k *redisSink) where() string   { return k.logKey() + " at " + k.url }

func (k *redisSink) renew() {
	defer close(k.done)
	t := time.NewTicker(lockRenew)
	defer t.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), redisDialTimeout)
			n, err := renewScript.Run(ctx, k.c, []string{k.lockKey()}, k.token, lockTTL.Milliseconds()).Int()
			cancel()
			if err == nil && n == 0 {
				k.mu.Lock()
				k.lost = fmt.Errorf("the queue lock %s is no longer this worker's (it expired or another worker took it)", k.lockKey())
				k.mu.Unlock()
			}
		}
	}
}

func (k *redisSink) check() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lost
}

func (k *redisSink) load() ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vals, err := k.c.LRange(ctx, k.logKey(), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read the queue log %s: %w", k.where(), err)
	}
	var sb strings.Builder
	for _, v := range vals {
		sb.WriteString(v)
	}
	return []byte(sb.String()), nil
}

func (k *redisSink) appendRecords(recs [][]byte) error {
	if err := k.check(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), redisDialTimeout)
	defer cancel()
	args := make([]any, len(recs))
	for i, r := range recs {
		args[i] = r
	}
	return k.c.RPush(ctx, k.logKey(), args...).Err()
}

func (k *redisSink) rewrite(recs [][]byte) error {
	if err := k.check(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := k.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, k.logKey())
		if len(recs) > 0 {
			args := make([]any, len(recs))
			for i, r := range recs {
				args[i] = r
			}
			p.RPush(ctx, k.logKey(), args...)
		}
		return nil
	})
	return err
}

func (k *redisSink) sync() error { return nil }

func (k *redisSink) close() error {
	close(k.stop)
	<-k.done
	ctx, cancel := context.WithTimeout(context.Background(), redisDialTimeout)
	defer cancel()
	_ = releaseScript.Run(ctx, k.c, []string{k.lockKey()}, k.token).Err()
	return k.c.Close()
}

// routeRedisLogs sends go-redis's own log lines to the worker's logger
// (debug) instead of stderr.
func routeRedisLogs(log hclog.Logger) { redis.SetLogger(redisLog{log.Named("redis")}) }

type redisLog struct{ log hclog.Logger }

func (l redisLog) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(strings.TrimSpace(fmt.Sprintf(format, v...)))
}

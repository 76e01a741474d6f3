package stream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/iii-sandbox/iii/protocol"
)

// The redis backend shares upstream iii's layout, so engines of both kinds
// on one Redis see the same streams and each other's change events:
//
//   - a group is the hash stream:<stream_name>:<group_id>, one field per
//     item (the item id), the value its JSON text;
//   - change events are PUBLISHed on the channel stream::events as the
//     Event JSON (upstream's StreamWrapperMessage), and every engine
//     SUBSCRIBEs to it and delivers them to its own socket subscribers.
//
// Everything read from Redis is checked as a client's write is: a value
// that is not JSON, or over Limits.ValueBytes, is STREAM_STORE_CORRUPT; an
// event that does not decode is logged and dropped.
const (
	// DefaultRedisURL is upstream's redis_url when none is given.
	DefaultRedisURL = "redis://localhost:6379"
	// RedisEventsChannel is the pub/sub channel of the change events.
	RedisEventsChannel = "stream::events"
	// RedisDialTimeout bounds reaching Redis at start (upstream's 5 s).
	RedisDialTimeout = 5 * time.Second

	redisKeyPrefix = "stream:"
	// redisIOTimeout bounds one command's read or write.
	redisIOTimeout = 5 * time.Second
	// redisUpdateRetries bounds the optimistic retries of one update
	// whose group another writer changed meanwhile.
	redisUpdateRetries = 64
	// redisScanCount is the COUNT hint of SCAN and HSCAN.
	redisScanCount = 512
	// redisChannelSize is how many received events wait for delivery
	// (which only queues them on the connections, so never for long).
	redisChannelSize = 1024
)

// setScript and deleteScript read the old value and write in one step,
// so a concurrent writer cannot slip in between (upstream's semantics).
var (
	setScript = redis.NewScript(`local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return old`)
	deleteScript = redis.NewScript(`local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
return old`)
)

// RedactURL is u with its password replaced by "xxxxx", for messages and
// logs; a URL that does not parse loses everything before its last '@'.
func RedactURL(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Redacted()
	}
	if i := strings.LastIndex(u, "@"); i >= 0 {
		scheme := ""
		if j := strings.Index(u, "://"); j >= 0 && j < i {
			scheme = u[:j+3]
		}
		return scheme + "xxxxx" + u[i:]
	}
	return u
}

// redisBackend keeps the items in Redis hashes and carries the change
// events over Redis pub/sub.
type redisBackend struct {
	limits  Limits
	log     hclog.Logger
	where   string // the redacted URL
	rdb     *redis.Client
	ps      *redis.PubSub
	deliver func(*Event)

	cancel context.CancelFunc
	wg     sync.WaitGroup // the subscription loop
}

var _ backend = (*redisBackend)(nil)

// openRedis connects to rawURL (DefaultRedisURL when empty), subscribes to
// RedisEventsChannel and starts delivering its events to deliver. Redis not
// answering within RedisDialTimeout (or ctx) is STREAM_BACKEND_UNAVAILABLE,
// naming the redacted URL.
func openRedis(ctx context.Context, rawURL string, limits Limits, log hclog.Logger, deliver func(*Event)) (*redisBackend, error) {
	if rawURL == "" {
		rawURL = DefaultRedisURL
	}
	where := RedactURL(rawURL)
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		// The parse error may quote the URL, password and all.
		return nil, errorf(CodeBackendUnavailable, "%s: redis_url %s is not a redis://, rediss:// or unix:// URL go-redis can use", WorkerName, where)
	}
	opt.DialTimeout = RedisDialTimeout
	opt.DialerRetries = 2
	opt.ReadTimeout, opt.WriteTimeout = redisIOTimeout, redisIOTimeout
	opt.ContextTimeoutEnabled = true
	opt.DisableIdentity = true
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	rdb := redis.NewClient(opt)
	unavailable := func(err error) error {
		_ = rdb.Close()
		return errorf(CodeBackendUnavailable, "%s cannot reach Redis at %s within %s: %v; start Redis there or give iii-stream another adapter.config.redis_url",
			WorkerName, where, RedisDialTimeout, err)
	}
	dctx, cancel := context.WithTimeout(ctx, RedisDialTimeout)
	defer cancel()
	if err := rdb.Ping(dctx).Err(); err != nil {
		return nil, unavailable(err)
	}
	b := &redisBackend{limits: limits, log: log, where: where, rdb: rdb, deliver: deliver}
	// Subscribed before Start returns, so no event published after it is
	// missed.
	b.ps = rdb.Subscribe(dctx, RedisEventsChannel)
	if _, err := b.ps.Receive(dctx); err != nil {
		_ = b.ps.Close()
		return nil, unavailable(err)
	}
	lctx, lcancel := context.WithCancel(context.Background())
	b.cancel = lcancel
	b.wg.Add(1)
	go b.receive(lctx)
	return b, nil
}

// receive delivers the events of the subscription until ctx ends. The
// channel is go-redis's: it pings an idle subscription and subscribes
// again after Redis went away (events published meanwhile are lost, as
// with upstream; the log says so).
func (b *redisBackend) receive(ctx context.Context) {
	defer b.wg.Done()
	ch := b.ps.ChannelWithSubscriptions(redis.WithChannelSize(redisChannelSize))
	for {
		var m any
		select {
		case <-ctx.Done():
			return
		case m = <-ch:
		}
		switch m := m.(type) {
		case nil: // closed
			return
		case *redis.Subscription:
			b.log.Warn("subscribed again to the stream events after losing Redis; events published meanwhile did not reach this engine's subscribers", "redis", b.where, "channel", m.Channel)
		case *redis.Message:
			ev, err := DecodeEvent([]byte(m.Payload), b.limits)
			if err != nil {
				b.log.Warn("stream event from Redis dropped", "channel", m.Channel, "error", err, "bytes", len(m.Payload))
				continue
			}
			b.deliver(ev)
		}
	}
}

func (b *redisBackend) Where() string { return b.where }

func (b *redisBackend) Close() error {
	b.cancel()
	b.wg.Wait()
	var errs []error
	for _, err := range []error{b.ps.Close(), b.rdb.Close()} {
		if err != nil && !errors.Is(err, redis.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close the Redis connection to %s: %w", b.where, err)
	}
	return nil
}

func redisKey(streamName, groupID string) string {
	return redisKeyPrefix + streamName + ":" + groupID
}

// ioError wraps a failed command: a key of another type under our prefix
// is STREAM_STORE_CORRUPT, another refusal by Redis (out of memory, read
// only, not authenticated) STREAM_STORE_IO, no answer at all
// STREAM_BACKEND_UNAVAILABLE.
func (b *redisBackend) ioError(what string, err error) error {
	var re redis.Error
	switch {
	case errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE"):
		return errorf(CodeStoreCorrupt, "%s in Redis at %s: the key is not a hash of stream items (%v); delete it to repair it", what, b.where, err)
	case errors.As(err, &re):
		return errorf(CodeStoreIO, "%s in Redis at %s: Redis refused: %v", what, b.where, err)
	}
	return errorf(CodeBackendUnavailable, "%s in Redis at %s: %v", what, b.where, err)
}

// readValue checks a value read from Redis as a client's write is checked.
func (b *redisBackend) readValue(key, itemID, raw string) (json.RawMessage, error) {
	if len(raw) > b.limits.ValueBytes {
		return nil, errorf(CodeStoreCorrupt, "item %q of %s in Redis at %s is %d bytes; at most %d are allowed per item: set or delete it to repair it",
			itemID, key, b.where, len(raw), b.limits.ValueBytes)
	}
	v, err := b.limits.compactValue(json.RawMessage(raw))
	if err != nil {
		return nil, errorf(CodeStoreCorrupt, "item %q of %s in Redis at %s does not hold a stream value (%v): set or delete it to repair it",
			itemID, key, b.where, err)
	}
	return v, nil
}

// replacedValue reads the old value a set or delete replaced: one that is
// not a stream value is reported as none (the write repaired the item).
func (b *redisBackend) replacedValue(key, itemID string, res any) json.RawMessage {
	s, ok := res.(string)
	if !ok {
		return nil
	}
	v, err := b.readValue(key, itemID, s)
	if err != nil {
		b.log.Warn("replaced an unreadable stream value in Redis", "error", err)
		return nil
	}
	return v
}

func (b *redisBackend) Set(ctx context.Context, streamName, groupID, itemID string, data json.RawMessage) (old, stored json.RawMessage, err error) {
	if err := b.limits.checkKey(streamName, groupID, itemID); err != nil {
		return nil, nil, err
	}
	v, err := b.limits.compactValue(data)
	if err != nil {
		return nil, nil, err
	}
	key := redisKey(streamName, groupID)
	res, err := setScript.Run(ctx, b.rdb, []string{key}, itemID, string(v)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, b.ioError("set "+key, err)
	}
	return b.replacedValue(key, itemID, res), v, nil
}

func (b *redisBackend) Get(ctx context.Context, streamName, groupID, itemID string) (json.RawMessage, error) {
	if err := b.limits.checkKey(streamName, groupID, itemID); err != nil {
		return nil, err
	}
	key := redisKey(streamName, groupID)
	raw, err := b.rdb.HGet(ctx, key, itemID).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, b.ioError("get "+key, err)
	}
	return b.readValue(key, itemID, raw)
}

func (b *redisBackend) Delete(ctx context.Context, streamName, groupID, itemID string) (json.RawMessage, error) {
	if err := b.limits.checkKey(streamName, groupID, itemID); err != nil {
		return nil, err
	}
	key := redisKey(streamName, groupID)
	res, err := deleteScript.Run(ctx, b.rdb, []string{key}, itemID).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, b.ioError("delete from "+key, err)
	}
	return b.replacedValue(key, itemID, res), nil
}

// List walks the hash with HSCAN, which for a small group (Redis keeps it
// as a listpack) is its insertion order; a large group comes in Redis's
// hash order (upstream's HGETALL has no order either). The whole list is
// bounded by Limits.StoreBytes.
func (b *redisBackend) List(ctx context.Context, streamName, groupID string) ([]json.RawMessage, error) {
	if err := b.limits.checkGroup(streamName, groupID); err != nil {
		return nil, err
	}
	key := redisKey(streamName, groupID)
	out := []json.RawMessage{}
	seen := map[string]bool{} // HSCAN may return a field twice
	var total int64
	var cursor uint64
	for {
		kvs, next, err := b.rdb.HScan(ctx, key, cursor, "", redisScanCount).Result()
		if err != nil {
			return nil, b.ioError("list "+key, err)
		}
		for i := 0; i+1 < len(kvs); i += 2 {
			field, raw := kvs[i], kvs[i+1]
			if seen[field] {
				continue
			}
			seen[field] = true
			total += cost(field, json.RawMessage(raw))
			if total > b.limits.StoreBytes {
				return nil, errorf(CodeValueTooLarge, "group %s in Redis at %s holds over %d bytes; it cannot be listed at once", key, b.where, b.limits.StoreBytes)
			}
			v, err := b.readValue(key, field, raw)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

// globEscape quotes the characters SCAN MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// scanGroups calls fn for every stream hash whose key matches pattern
// (SCAN, never KEYS), bounding what it collects by Limits.StoreBytes.
func (b *redisBackend) scanGroups(ctx context.Context, pattern string, fn func(key string)) error {
	var cursor uint64
	var total int64
	for {
		keys, next, err := b.rdb.ScanType(ctx, cursor, pattern, redisScanCount, "hash").Result()
		if err != nil {
			return b.ioError("scan "+pattern, err)
		}
		for _, k := range keys {
			if total += groupCost(k); total > b.limits.StoreBytes {
				return errorf(CodeValueTooLarge, "Redis at %s holds over %d bytes of stream keys matching %s; they cannot be listed at once", b.where, b.limits.StoreBytes, pattern)
			}
			fn(k)
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// Groups lists the hashes stream:<stream_name>:*. A stream name holding ':'
// is ambiguous in this layout (upstream's too): stream "a" then also lists
// the groups "b:…" of a stream "a:b".
func (b *redisBackend) Groups(ctx context.Context, streamName string) ([]string, error) {
	if err := b.limits.checkID("stream_name", streamName); err != nil {
		return nil, err
	}
	prefix := redisKeyPrefix + streamName + ":"
	set := map[string]bool{}
	err := b.scanGroups(ctx, globEscape(prefix)+"*", func(key string) {
		g, ok := strings.CutPrefix(key, prefix)
		if ok && b.limits.checkID("group_id", g) == nil {
			set[g] = true
		}
	})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(set))
	for g := range set {
		out = append(out, g)
	}
	slices.Sort(out)
	return out, nil
}

// All lists the hashes stream:*, each read as stream:<stream>:<group> split
// at the first ':' after the prefix; keys that do not read as valid ids
// are skipped.
func (b *redisBackend) All(ctx context.Context) ([]Meta, error) {
	streams := map[string]map[string]bool{}
	err := b.scanGroups(ctx, redisKeyPrefix+"*", func(key string) {
		name, group, ok := strings.Cut(strings.TrimPrefix(key, redisKeyPrefix), ":")
		if !ok || b.limits.checkGroup(name, group) != nil {
			return
		}
		if streams[name] == nil {
			streams[name] = map[string]bool{}
		}
		streams[name][group] = true
	})
	if err != nil {
		return nil, err
	}
	out := make([]Meta, 0, len(streams))
	for name, groups := range streams {
		m := Meta{ID: name, Groups: make([]string, 0, len(groups))}
		for g := range groups {
			m.Groups = append(m.Groups, g)
		}
		slices.Sort(m.Groups)
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Meta) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Update reads the item under WATCH, applies the ops here (applyOps, the
// kv store's semantics and error shapes) and writes the result in a
// MULTI/EXEC that fails if the group changed meanwhile; then it retries.
func (b *redisBackend) Update(ctx context.Context, streamName, groupID, itemID string, ops []UpdateOp) (old, updated json.RawMessage, errs []OpError, err error) {
	if err := b.limits.checkKey(streamName, groupID, itemID); err != nil {
		return nil, nil, nil, err
	}
	key := redisKey(streamName, groupID)
	attempt := func(tx *redis.Tx) error {
		old, updated, errs = nil, nil, nil
		raw, err := tx.HGet(ctx, key, itemID).Result()
		var cur any
		exists := false
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return b.ioError("update "+key, err)
		default:
			if old, err = b.readValue(key, itemID, raw); err != nil {
				return err
			}
			if cur, err = decodeValue(old); err != nil {
				return errorf(CodeStoreCorrupt, "item %q of %s in Redis at %s holds invalid JSON: %v", itemID, key, b.where, err)
			}
			exists = true
		}
		next, opErrs := applyOps(cur, exists, ops)
		enc, err := json.Marshal(next)
		if err != nil {
			return errorf(CodeInvalidInput, "the updated value cannot be encoded: %v", err)
		}
		if len(enc) > b.limits.ValueBytes {
			return errorf(CodeValueTooLarge, "the updated value is %d bytes; at most %d are allowed per item", len(enc), b.limits.ValueBytes)
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, key, itemID, string(enc))
			return nil
		})
		if err != nil {
			return err
		}
		updated, errs = enc, opErrs
		return nil
	}
	for range redisUpdateRetries {
		err = b.rdb.Watch(ctx, attempt, key)
		if !errors.Is(err, redis.TxFailedErr) {
			break
		}
	}
	switch {
	case err == nil:
		return old, updated, errs, nil
	case errors.Is(err, redis.TxFailedErr):
		return nil, nil, nil, errorf(CodeBackendUnavailable, "update %s in Redis at %s: the group kept changing under %d attempts; try again", key, b.where, redisUpdateRetries)
	}
	if eb := (*protocol.ErrorBody)(nil); errors.As(err, &eb) {
		return nil, nil, nil, err
	}
	return nil, nil, nil, b.ioError("update "+key, err)
}

func (b *redisBackend) Publish(ctx context.Context, ev *Event) error {
	payload, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode the stream event: %w", err)
	}
	if err := b.rdb.Publish(ctx, RedisEventsChannel, payload).Err(); err != nil {
		return b.ioError("publish on "+RedisEventsChannel, err)
	}
	return nil
}

// RouteRedisLogs sends the redis client library's own log lines (its
// connection pool's dial retries, say) to log at debug level instead of
// the process's stderr. The library keeps one logger per process, so the
// program's entry point calls this once; the worker reports what matters
// itself, with the URL's password redacted.
func RouteRedisLogs(log hclog.Logger) {
	redis.SetLogger(redisLog{log.Named("redis")})
}

type redisLog struct{ log hclog.Logger }

func (l redisLog) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(strings.TrimSpace(fmt.Sprintf(format, v...)))
}

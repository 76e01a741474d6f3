package cron

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/redisserver"
	"github.com/iii-sandbox/iii/protocol"
)

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want LockSpec
		err  string
	}{
		{``, LockSpec{Adapter: "local", Dir: "/p/data/cron"}, ""},
		{`null`, LockSpec{Adapter: "local", Dir: "/p/data/cron"}, ""},
		{DefaultConfig, LockSpec{Adapter: "local", Dir: "/p/data/cron"}, ""},
		{`{"adapter":{"name":"local","config":{"lock_dir":"var/locks"}}}`, LockSpec{Adapter: "local", Dir: "/p/var/locks"}, ""},
		{`{"adapter":{"name":"local","config":{"lock_dir":"/abs"}}}`, LockSpec{Adapter: "local", Dir: "/abs"}, ""},
		{`{"adapter":{"name":"redis"}}`, LockSpec{Adapter: "redis", RedisURL: DefaultRedisURL}, ""},
		{`{"adapter":{"name":"redis","config":{"redis_url":"redis://r:1"}}}`, LockSpec{Adapter: "redis", RedisURL: "redis://r:1"}, ""},
		{`{"adapter":{"name":"kv"}}`, LockSpec{}, `adapter "kv" is not one of local, redis`},
		{`{"adapter":{"name":"redis","config":{"url":"x"}}}`, LockSpec{}, "keys: redis_url"},
		{`{"adapter":{"name":"local","config":{"dir":"x"}}}`, LockSpec{}, "keys: lock_dir"},
		{`{"lock_ttl":5}`, LockSpec{}, "keys: adapter"},
		{`[1]`, LockSpec{}, "INVALID_CONFIG"},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			c, err := ParseConfig(json.RawMessage(tc.raw))
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				var eb *protocol.ErrorBody
				assert.Check(t, errors.As(err, &eb) && eb.Code == CodeInvalidConfig)
				return
			}
			assert.NilError(t, err)
			spec, err := c.Lock("/p")
			assert.NilError(t, err)
			assert.Check(t, is.DeepEqual(spec, tc.want))
		})
	}
}

func TestMakefileVersion(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	assert.NilError(t, err)
	assert.Check(t, is.Contains(string(b), "CRON_VERSION ?= "+Version+"\n"))
	assert.Check(t, is.Contains(string(b), "CRON_DEFAULTS := "+DefaultConfig+"\n"))
}

// TestFileLockPrunes: files of jobs idle for a day go at open; others
// stay.
func TestFileLockPrunes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "cron")
	l, err := OpenFileLock(dir)
	assert.NilError(t, err)
	ctx := context.Background()
	for _, j := range []string{"old", "new"} {
		won, err := l.Claim(ctx, j, utc("2026-01-01T00:00:01Z"))
		assert.NilError(t, err)
		assert.Check(t, won)
	}
	old := l.path("old")
	past := time.Now().Add(-48 * time.Hour)
	assert.NilError(t, os.Chtimes(old, past, past))
	_, err = OpenFileLock(dir)
	assert.NilError(t, err)
	_, err = os.Stat(old)
	assert.Check(t, os.IsNotExist(err), "the idle job's file is pruned")
	_, err = os.Stat(l.path("new"))
	assert.NilError(t, err)
	info, err := os.Stat(dir)
	assert.NilError(t, err)
	assert.Check(t, is.Equal(info.Mode().Perm(), os.FileMode(0o700)))
	ents, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, e := range ents {
		assert.Check(t, strings.HasPrefix(filepath.Base(e), "job-"), e)
	}
}

// TestRedisLock: the redis adapter's claims against a real redis-server.
func TestRedisLock(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	srv := redisserver.Start(t)
	ctx := context.Background()
	l1, err := OpenRedisLock(ctx, srv.URL)
	assert.NilError(t, err)
	defer l1.Close()
	l2, err := OpenRedisLock(ctx, srv.URL)
	assert.NilError(t, err)
	defer l2.Close()
	t1, t2 := utc("2026-01-01T00:00:01Z"), utc("2026-01-01T00:00:02Z")
	for _, tc := range []struct {
		l    *RedisLock
		job  string
		tick time.Time
		won  bool
	}{
		{l1, "a", t1, true}, {l2, "a", t1, false}, {l2, "b", t1, true}, {l2, "a", t2, true}, {l1, "a", t2, false},
	} {
		won, err := tc.l.Claim(ctx, tc.job, tc.tick)
		assert.NilError(t, err)
		assert.Check(t, is.Equal(won, tc.won), "%s %s", tc.job, tc.tick)
	}
}

func TestRedisLockUnavailable(t *testing.T) {
	_, err := OpenLock(context.Background(), LockSpec{Adapter: "redis", RedisURL: "redis://:pw@127.0.0.1:1"})
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Check(t, is.Equal(eb.Code, CodeLockUnavailable))
	assert.Check(t, !strings.Contains(err.Error(), "pw"), "the password is not in %v", err)
}

package cron

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// FileLock is the `local` adapter's lock: cron workers of one project
// (one host, one compose directory) share a directory holding one small
// file per job with the last tick fired. A claim takes the file's flock,
// reads the tick, and wins when this tick is later, writing it. No Redis
// is needed; the lock holds across processes, and a worker that dies
// while holding it releases it with its file descriptors.
type FileLock struct {
	dir string
}

// staleClaim is how old a job's file must be for OpenFileLock to remove
// it (jobs come and go with their triggers).
const staleClaim = 24 * time.Hour

// OpenFileLock makes dir (0700) and removes the files of jobs that have
// not fired for a day.
func OpenFileLock(dir string) (*FileLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make the cron lock directory %s: %w", dir, err)
	}
	l := &FileLock{dir: dir}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the cron lock directory %s: %w", dir, err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".tick") {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleClaim {
			l.prune(filepath.Join(dir, e.Name()))
		}
	}
	return l, nil
}

// prune removes a job's file while holding its lock, so a claim racing
// with it sees the file replaced and retries on the new one.
func (l *FileLock) prune(path string) {
	f, err := l.openLocked(path)
	if err != nil {
		return
	}
	_ = os.Remove(path)
	_ = f.Close()
}

func (l *FileLock) path(jobID string) string {
	return filepath.Join(l.dir, "job-"+hex.EncodeToString([]byte(jobID))+".tick")
}

// openLocked opens path with an exclusive flock, retrying when the file
// was removed or replaced between the open and the lock.
func (l *FileLock) openLocked(path string) (*os.File, error) {
	for range 16 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		var held, named syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &held) == nil && syscall.Stat(path, &named) == nil && held.Ino == named.Ino && held.Dev == named.Dev {
			return f, nil
		}
		_ = f.Close()
	}
	return nil, fmt.Errorf("%s keeps being replaced", path)
}

// Claim wins (job, tick) for the first worker to record it.
func (l *FileLock) Claim(_ context.Context, jobID string, tick time.Time) (bool, error) {
	f, err := l.openLocked(l.path(jobID))
	if err != nil {
		return false, err
	}
	defer f.Close() // releases the flock
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	if last, err := strconv.ParseInt(strings.TrimSpace(string(buf[:n])), 10, 64); err == nil && last >= tick.Unix() {
		return false, nil
	}
	s := strconv.FormatInt(tick.Unix(), 10) + "\n"
	if err := f.Truncate(0); err != nil {
		return false, err
	}
	if _, err := f.WriteAt([]byte(s), 0); err != nil {
		return false, err
	}
	return true, nil
}

// Close releases nothing: every claim closes its file.
func (l *FileLock) Close() error { return nil }

var _ Lock = (*FileLock)(nil)

// RedisLock is the `redis` adapter's lock, for cron workers on several
// hosts: a claim is SET NX of a key naming the job and the tick, which
// expires after lockTTL (upstream's 30 s).
type RedisLock struct {
	c *redis.Client
}

// Redis key prefix and TTL of a claim.
const (
	redisLockPrefix = "cron_lock:"
	lockTTL         = 30 * time.Second
	redisDialWait   = 5 * time.Second
)

// OpenRedisLock connects and pings (bounded by 5 s).
func OpenRedisLock(ctx context.Context, rawURL string) (*RedisLock, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, errorf(CodeInvalidConfig, "redis_url: %v", err)
	}
	opt.DisableIdentity = true
	c := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, redisDialWait)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, errorf(CodeLockUnavailable, "redis does not answer: %v", err)
	}
	return &RedisLock{c: c}, nil
}

// Claim is SET cron_lock:<job>:<tick> NX PX 30000.
func (l *RedisLock) Claim(ctx context.Context, jobID string, tick time.Time) (bool, error) {
	key := redisLockPrefix + jobID + ":" + strconv.FormatInt(tick.Unix(), 10)
	ok, err := l.c.SetNX(ctx, key, "1", lockTTL).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	return ok, nil
}

// Close closes the connection.
func (l *RedisLock) Close() error { return l.c.Close() }

// routeRedisLogs sends go-redis's own log lines to the worker's log at
// debug level (a Redis that goes away is reported per tick anyway).
func routeRedisLogs(log hclog.Logger) { redis.SetLogger(redisLog{log.Named("redis")}) }

type redisLog struct{ log hclog.Logger }

func (l redisLog) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(strings.TrimSpace(fmt.Sprintf(format, v...)))
}

var _ Lock = (*RedisLock)(nil)

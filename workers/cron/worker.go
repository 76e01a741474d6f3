// Package cron is the registry's `cron` worker: the `cron` trigger type of
// upstream's trigger-type generation (what the published Node iii-sdk
// 0.22.1 speaks), firing a function on a cron expression (seconds field
// first, UTC; expr.go). Each job fires serially and never replays missed
// ticks; cron workers of one project share a lock (a directory, or Redis)
// so one fires each tick. docs/standard-workers.md is its user's page;
// cmd/cron is the binary Compose runs (workers/workerkit connects it).
package cron

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/protocol"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

// ClientInvoker is the Invoker of a connected worker. The engine checks
// the call as the trigger's registrant (a socket trigger provider's call
// of its binding's target; docs/security.md).
type ClientInvoker struct{ C *client.Client }

// Invoke calls functionID in namespace ("" is default).
func (ci ClientInvoker) Invoke(ctx context.Context, ns, fn string, payload, md json.RawMessage) (json.RawMessage, error) {
	if ns == "" {
		ns = "default"
	}
	opts := []client.CallOption{client.WithNamespace(ns), client.WithTimeout(callTimeout)}
	if len(md) > 0 && !bytes.Equal(bytes.TrimSpace(md), []byte("null")) {
		opts = append(opts, client.WithMetadata(md))
	}
	return ci.C.Call(ctx, fn, payload, opts...)
}

// triggerConfig is a cron trigger's config (upstream's).
type triggerConfig struct {
	Expression          *string `json:"expression"`
	ConditionFunctionID *string `json:"condition_function_id"`
}

// Triggers is the `cron` trigger type's provider side.
type Triggers struct {
	S *Scheduler
	// Session is the provider connection's current worker id (nil: "").
	Session func() string
}

var _ client.TriggerHandler = Triggers{}

// ParseTrigger reads a registration into a Job, with upstream's errors.
func ParseTrigger(t client.TriggerRegistration) (Job, error) {
	var cfg triggerConfig
	raw := bytes.TrimSpace(t.Config)
	if len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		if raw[0] != '{' || json.Unmarshal(raw, &cfg) != nil {
			return Job{}, errorf(CodeInvalidCronExpression, "Failed to parse trigger config: cron trigger %s needs an object {expression, condition_function_id?}", t.ID)
		}
	}
	if cfg.Expression == nil || *cfg.Expression == "" {
		return Job{}, errorf(CodeInvalidCronExpression, "Cron expression is required")
	}
	s, err := Parse(*cfg.Expression)
	if err != nil {
		return Job{}, errorf(CodeInvalidCronExpression, "invalid cron expression '%s': %v", *cfg.Expression, err)
	}
	j := Job{ID: t.ID, FunctionID: t.FunctionID, Namespace: t.Namespace, Metadata: t.Metadata, Schedule: s}
	if cfg.ConditionFunctionID != nil {
		j.Condition = *cfg.ConditionFunctionID
	}
	return j, nil
}

// RegisterTrigger schedules the trigger.
func (tr Triggers) RegisterTrigger(_ context.Context, t client.TriggerRegistration) error {
	j, err := ParseTrigger(t)
	if err != nil {
		return err
	}
	if tr.Session != nil {
		j.Session = tr.Session()
	}
	if err := tr.S.Add(j); err != nil {
		var dup ErrDuplicate
		if errors.As(err, &dup) {
			return &protocol.ErrorBody{Code: CodeAlreadyRegistered, Message: dup.Error()}
		}
		return err
	}
	tr.S.log.Info("cron trigger scheduled", "job_id", j.ID, "expression", j.Schedule.String(), "function_id", j.FunctionID, "namespace", j.Namespace)
	return nil
}

// UnregisterTrigger stops the job.
func (tr Triggers) UnregisterTrigger(_ context.Context, t client.TriggerRegistration) error {
	if tr.S.Remove(t.ID) {
		tr.S.log.Info("cron trigger removed", "job_id", t.ID)
	}
	return nil
}

// Register serves the `cron` trigger type on c.
func (tr Triggers) Register(c *client.Client) error {
	_, err := c.RegisterTriggerType(client.TriggerTypeDef{
		ID:                   TriggerType,
		Description:          "Fire a function on a cron schedule (sec min hour day-of-month month day-of-week [year], UTC): {trigger: \"cron\", job_id, scheduled_time, actual_time}",
		TriggerRequestSchema: json.RawMessage(`{"type":"object","required":["expression"],"properties":{"expression":{"type":"string"},"condition_function_id":{"type":"string"}}}`),
		CallRequestSchema:    json.RawMessage(`{"type":"object","properties":{"trigger":{"const":"cron"},"job_id":{"type":"string"},"scheduled_time":{"type":"string","format":"date-time"},"actual_time":{"type":"string","format":"date-time"}}}`),
	}, tr)
	return err
}

// Spec is the worker's workerkit.Spec.
func Spec() workerkit.Spec {
	return workerkit.Spec{Name: Name, Version: Version, DefaultConfig: json.RawMessage(DefaultConfig),
		Description: "iii cron: fire functions on cron schedules (trigger type cron)"}
}

// OpenLock opens the lock spec names.
func OpenLock(ctx context.Context, spec LockSpec) (Lock, error) {
	if spec.Adapter == "redis" {
		return OpenRedisLock(ctx, spec.RedisURL)
	}
	l, err := OpenFileLock(spec.Dir)
	if err != nil {
		return nil, errorf(CodeLockUnavailable, "%v", err)
	}
	return l, nil
}

// Run is the worker's life under workerkit: open the lock from the
// configuration file, connect, serve the trigger type, follow the
// configuration entry; on ctx's end stop every job.
func Run(ctx context.Context, k *workerkit.Kit) error {
	routeRedisLogs(k.Log)
	cfg, err := ParseConfig(k.FileConfig())
	if err != nil {
		return err
	}
	spec, err := cfg.Lock(k.Env.BaseDir())
	if err != nil {
		return err
	}
	lock, err := OpenLock(ctx, spec)
	if err != nil {
		return err
	}
	defer lock.Close()
	k.Log.Info("cron lock", "adapter", spec.Adapter, "dir", spec.Dir, "version", Version)
	if err := k.Connect(ctx); err != nil {
		return err
	}
	s := NewScheduler(SchedulerOptions{Invoker: ClientInvoker{C: k.Client}, Lock: lock, Logger: k.Log})
	defer s.Close()
	if err := (Triggers{S: s, Session: k.Client.WorkerID}).Register(k.Client); err != nil {
		return fmt.Errorf("register the cron trigger type: %w", err)
	}
	go sweep(ctx, s, k.Client.WorkerID, k.Log)
	if err := k.WatchConfig(ctx, func(_ context.Context, raw json.RawMessage) error {
		c, err := ParseConfig(raw)
		if err != nil {
			return err
		}
		if next, _ := c.Lock(k.Env.BaseDir()); next != spec {
			k.Log.Warn("the cron adapter changed; restart the worker to switch to it (compose::restart worker=cron)", "from", spec.Adapter, "to", next.Adapter)
		}
		return nil
	}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// Sweep timing: how often the connection's id is looked at, and how long
// after a reconnect the engine has to send the bindings again.
const (
	sweepEvery = 5 * time.Second
	sweepGrace = 30 * time.Second
)

// sweep drops, once a reconnect has settled, the jobs the engine did not
// send again on the new connection (their triggers went away meanwhile).
func sweep(ctx context.Context, s *Scheduler, session func() string, log hclog.Logger) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	var sw sweeper
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if cur, ok := sw.due(session(), now); ok {
				for _, id := range s.Prune(cur) {
					log.Info("cron trigger dropped: not registered again after a reconnect", "job_id", id)
				}
			}
		}
	}
}

// sweeper says when to prune: once per connection id, sweepGrace after
// it was first seen.
type sweeper struct {
	cur    string
	since  time.Time
	pruned bool
}

func (w *sweeper) due(cur string, now time.Time) (string, bool) {
	if cur != w.cur {
		w.cur, w.since, w.pruned = cur, now, false
		return "", false
	}
	if w.pruned || cur == "" || now.Sub(w.since) < sweepGrace {
		return "", false
	}
	w.pruned = true
	return cur, true
}

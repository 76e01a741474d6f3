// Package queue is the registry's `queue` worker: durable topics (the
// `durable:subscriber` trigger type of upstream's trigger-type
// generation, what the published Node iii-sdk 0.22.1 speaks, and
// iii::durable::publish fanning out to every subscriber), retries with
// exponential backoff, dead letters with redrive and discard, named
// function queues (standard and fifo) and the engine's enqueue provider
// engine::queue::enqueue, with the read-only engine::queue::* views. The
// builtin adapter keeps everything in a write-ahead log (store.go), so an
// accepted message is delivered at least once across restarts of the
// worker and of the engine. docs/standard-workers.md is its user's page;
// cmd/queue is the binary Compose runs (workers/workerkit connects it).
package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/protocol"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

// EnvProviderToken carries the narrow engine credential Compose issues to
// the queue package only (compose/daemon/provider.go): it lets the
// worker's second connection register engine::queue::enqueue and the
// engine::queue::* views in namespace default, and nothing else
// privileged.
const EnvProviderToken = "III_QUEUE_PROVIDER_TOKEN"

// ProviderConnectionName is the provider connection's worker name
// (upstream's queue-engine).
const ProviderConnectionName = "queue-engine"

// Function ids.
const (
	FnPublish        = "iii::durable::publish"
	FnDefine         = "queue::define"
	FnRedrive        = "iii::queue::redrive"
	FnRedriveMessage = "iii::queue::redrive_message"
	FnDiscardMessage = "iii::queue::discard_message"
	FnEnqueue        = "engine::queue::enqueue"
	FnListTopics     = "engine::queue::list_topics"
	FnDLQTopics      = "engine::queue::dlq_topics"
	FnTopicStats     = "engine::queue::topic_stats"
	FnDLQMessages    = "engine::queue::dlq_messages"
)

// ClientInvoker is the Invoker of a connected client; a nil client (the
// provider connection not up yet) is not reachable.
type ClientInvoker struct{ C func() *client.Client }

// errNoConnection: the connection a delivery needs is not up.
var errNoConnection = errors.New("the queue worker's provider connection is not up")

// Invoke calls fn in ns ("" is default).
func (ci ClientInvoker) Invoke(ctx context.Context, ns, fn string, payload, md json.RawMessage, timeout time.Duration) (json.RawMessage, error) {
	c := ci.C()
	if c == nil {
		return nil, errNoConnection
	}
	if ns == "" {
		ns = "default"
	}
	opts := []client.CallOption{client.WithNamespace(ns), client.WithTimeout(timeout)}
	if len(md) > 0 && !bytes.Equal(bytes.TrimSpace(md), []byte("null")) {
		opts = append(opts, client.WithMetadata(md))
	}
	return c.Call(ctx, fn, payload, opts...)
}

// Spec is the worker's workerkit.Spec.
func Spec() workerkit.Spec {
	return workerkit.Spec{Name: Name, Version: Version, DefaultConfig: json.RawMessage(DefaultConfig),
		Description: "iii queue: durable topics and function queues with retries and dead letters (trigger type durable:subscriber, engine::queue::enqueue)"}
}

// OpenStoreSpec opens the store spec names.
func OpenStoreSpec(ctx context.Context, spec StoreSpec) (*Store, error) {
	if spec.RedisURL != "" {
		return OpenRedisStore(ctx, spec.RedisURL, spec.RedisPrefix)
	}
	if spec.Dir == "" {
		return OpenMemory(), nil
	}
	s, err := OpenStore(spec.Dir)
	if err != nil {
		return nil, errorf(CodeStoreUnavailable, "%v", err)
	}
	return s, nil
}

// triggers is the durable:subscriber trigger type's provider side.
type triggers struct{ d *Dispatcher }

func (t triggers) RegisterTrigger(_ context.Context, r client.TriggerRegistration) error {
	return t.d.Subscribe(r.ID, r.FunctionID, r.Namespace, r.Config, r.Metadata)
}

func (t triggers) UnregisterTrigger(_ context.Context, r client.TriggerRegistration) error {
	t.d.Unsubscribe(r.ID)
	return nil
}

// queueArg reads {queue|topic, ...} into dst and returns the name.
func queueArg(raw json.RawMessage, dst any) (string, error) {
	var in struct {
		Queue *string `json:"queue"`
		Topic *string `json:"topic"`
	}
	if len(bytes.TrimSpace(raw)) > 0 && json.Unmarshal(raw, &in) != nil {
		return "", errorf(CodeInvalidArgument, "the request must be an object")
	}
	if dst != nil {
		if err := json.Unmarshal(raw, dst); err != nil {
			return "", errorf(CodeInvalidArgument, "the request: %v", err)
		}
	}
	switch {
	case in.Queue != nil && *in.Queue != "":
		return *in.Queue, nil
	case in.Topic != nil:
		return *in.Topic, nil
	case in.Queue != nil:
		return *in.Queue, nil
	}
	return "", nil
}

func fn(id, desc string, h func(ctx context.Context, data json.RawMessage) (any, error)) (client.FunctionDef, client.Handler) {
	return client.FunctionDef{ID: id, Description: desc, RequestSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, inv *client.Invocation) (any, error) { return h(ctx, inv.Data) }
}

// Register serves the worker's own functions and trigger type on c.
func Register(c *client.Client, d *Dispatcher) error {
	defs := []func() (client.FunctionDef, client.Handler){
		func() (client.FunctionDef, client.Handler) {
			return fn(FnPublish, "Publish data to a durable topic: every subscriber gets it ({topic|queue, data} → null)",
				func(_ context.Context, raw json.RawMessage) (any, error) {
					var in struct {
						Data json.RawMessage `json:"data"`
					}
					topic, err := queueArg(raw, &in)
					if err != nil {
						return nil, err
					}
					if strings.TrimSpace(topic) == "" {
						return nil, errorf(CodeTopicNotSet, "topic_not_set: publish needs {topic (or queue), data}")
					}
					_, err = d.Publish(topic, in.Data)
					return nil, err
				})
		},
		func() (client.FunctionDef, client.Handler) {
			return fn(FnDefine, "Provision or change a function queue ({queue, config} → {queue, changed})",
				func(_ context.Context, raw json.RawMessage) (any, error) {
					var in struct {
						Config json.RawMessage `json:"config"`
					}
					q, err := queueArg(raw, &in)
					if err != nil {
						return nil, err
					}
					changed, err := d.Define(q, in.Config)
					if err != nil {
						return nil, err
					}
					return map[string]any{"queue": q, "changed": changed}, nil
				})
		},
		func() (client.FunctionDef, client.Handler) {
			return fn(FnRedrive, "Move every dead letter of a queue back to it ({queue|topic} → {queue, redriven})",
				func(_ context.Context, raw json.RawMessage) (any, error) {
					q, err := queueArg(raw, nil)
					if err != nil {
						return nil, err
					}
					n, err := d.Redrive(q)
					if err != nil {
						return nil, err
					}
					return map[string]any{"queue": q, "redriven": n}, nil
				})
		},
		func() (client.FunctionDef, client.Handler) {
			return fn(FnRedriveMessage, "Move one dead letter back ({queue|topic, message_id} → {queue, message_id, redriven})",
				func(_ context.Context, raw json.RawMessage) (any, error) {
					var in struct {
						MessageID string `json:"message_id"`
					}
					q, err := queueArg(raw, &in)
					if err != nil {
						return nil, err
					}
					if err := d.RedriveMessage(q, in.MessageID); err != nil {
						return nil, err
					}
					return map[string]any{"queue": q, "message_id": in.MessageID, "redriven": true}, nil
				})
		},
		func() (client.FunctionDef, client.Handler) {
			return fn(FnDiscardMessage, "Drop one dead letter ({queue|topic, message_id} → {queue, message_id, discarded})",
				func(_ context.Context, raw json.RawMessage) (any, error) {
					var in struct {
						MessageID string `json:"message_id"`
					}
					q, err := queueArg(raw, &in)
					if err != nil {
						return nil, err
					}
					if err := d.Discard(q, in.MessageID); err != nil {
						return nil, err
					}
					return map[string]any{"queue": q, "message_id": in.MessageID, "discarded": true}, nil
				})
		},
	}
	for _, f := range defs {
		def, h := f()
		if _, err := c.RegisterFunction(def, h); err != nil {
			return fmt.Errorf("register %s: %w", def.ID, err)
		}
	}
	_, err := c.RegisterTriggerType(client.TriggerTypeDef{
		ID:                   TriggerType,
		Description:          "Deliver a durable topic's messages to a function, with retries and a DLQ ({queue|topic, max_retries?, backoff_ms?, condition_function_id?, group?, queue_config?})",
		TriggerRequestSchema: json.RawMessage(`{"type":"object","properties":{"queue":{"type":"string"},"topic":{"type":"string"},"max_retries":{"type":"integer"},"backoff_ms":{"type":"integer"},"condition_function_id":{"type":"string"},"group":{"type":"string"},"queue_config":{"type":"object"}}}`),
	}, triggers{d})
	if err != nil {
		return fmt.Errorf("register the %s trigger type: %w", TriggerType, err)
	}
	return nil
}

// RegisterProvider serves engine::queue::enqueue and the read-only views
// on the provider connection c (namespace default).
func RegisterProvider(c *client.Client, d *Dispatcher) error {
	type def struct {
		id, desc   string
		privileged bool
		h          func(context.Context, json.RawMessage) (any, error)
	}
	defs := []def{
		{FnEnqueue, "The engine's enqueue provider: store an enqueued call and deliver it later ({queue, function_id, data, messageReceiptId} → {messageReceiptId})", false,
			func(_ context.Context, raw json.RawMessage) (any, error) {
				var in EnqueueRequest
				dec := json.NewDecoder(bytes.NewReader(raw))
				if err := dec.Decode(&in); err != nil {
					return nil, errorf(CodeInvalidArgument, "engine::queue::enqueue: %v", err)
				}
				id, err := d.Enqueue(in)
				if err != nil {
					// The engine puts the code before the message itself.
					var eb *protocol.ErrorBody
					if errors.As(err, &eb) {
						return nil, &protocol.ErrorBody{Code: eb.Code, Message: strings.TrimPrefix(eb.Message, eb.Code+": ")}
					}
					return nil, err
				}
				return map[string]string{"messageReceiptId": id}, nil
			}},
		{FnListTopics, "The topics and function queues ({} → [{name, broker_type, subscriber_count}])", false,
			func(context.Context, json.RawMessage) (any, error) { return d.Topics(), nil }},
		{FnDLQTopics, "The queues with dead letters ({} → [{name, broker_type, message_count}])", false,
			func(context.Context, json.RawMessage) (any, error) { return d.DLQTopics(), nil }},
		{FnTopicStats, "One topic's or queue's depth, consumers, DLQ depth and config ({topic|queue} → {depth, consumer_count, dlq_depth, config})", false,
			func(_ context.Context, raw json.RawMessage) (any, error) {
				q, err := queueArg(raw, nil)
				if err != nil {
					return nil, err
				}
				return d.Stats(q)
			}},
		// The dead letters' payloads are other callers' data: engine
		// token only.
		{FnDLQMessages, "A queue's dead letters, oldest first ({topic|queue, offset?, limit?} → [{id, payload, error, failed_at, retries, size_bytes}]); needs the engine token", true,
			func(_ context.Context, raw json.RawMessage) (any, error) {
				var in struct {
					Offset int `json:"offset"`
					Limit  int `json:"limit"`
				}
				q, err := queueArg(raw, &in)
				if err != nil {
					return nil, err
				}
				return d.DLQMessages(q, in.Offset, in.Limit)
			}},
	}
	for _, f := range defs {
		h := f.h
		fd := client.FunctionDef{ID: f.id, Description: f.desc, RequestSchema: json.RawMessage(`{"type":"object"}`)}
		if f.privileged {
			fd.Metadata = json.RawMessage(`{"privileged":true}`)
		}
		if _, err := c.RegisterFunction(fd, func(ctx context.Context, inv *client.Invocation) (any, error) { return h(ctx, inv.Data) }); err != nil {
			return fmt.Errorf("register %s: %w", f.id, err)
		}
	}
	return nil
}

// Run is the worker's life under workerkit: open the store from the
// configuration file, connect, serve the functions and the trigger type,
// connect the provider when Compose gave it its credential, follow the
// configuration entry; on ctx's end stop delivering and close the store.
func Run(ctx context.Context, k *workerkit.Kit) error {
	routeRedisLogs(k.Log)
	cfg, err := ParseConfig(k.FileConfig())
	if err != nil {
		return err
	}
	spec, err := cfg.Store(k.Env.BaseDir())
	if err != nil {
		return err
	}
	store, err := OpenStoreSpec(ctx, spec)
	if err != nil {
		return err
	}
	defer store.Close()
	if store.Recovered != "" {
		k.Log.Warn("the queue log was damaged; kept what came before", "detail", store.Recovered)
	}
	k.Log.Info("queue store", "dir", spec.Dir, "redis", redactURL(spec.RedisURL), "pending", len(store.Pending()), "version", Version)
	if err := k.Connect(ctx); err != nil {
		return err
	}
	var provider atomic.Pointer[client.Client]
	token := strings.TrimSpace(k.Spec.Getenv(EnvProviderToken))
	d := NewDispatcher(DispatcherOptions{Store: store, Queues: cfg.QueueConfigs, Logger: k.Log,
		Topics:   ClientInvoker{C: func() *client.Client { return k.Client }},
		Enqueued: ClientInvoker{C: provider.Load}})
	if err := Register(k.Client, d); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	wg.Add(2)
	go func() { defer wg.Done(); d.Run(runCtx) }()
	go func() {
		defer wg.Done()
		store.SyncEvery(spec.SaveInterval, runCtx.Done(), func(err error) { k.Log.Warn("fsync of the queue log failed", "error", err) })
	}()
	if token == "" {
		k.Log.Warn("no provider credential (" + EnvProviderToken + "): engine::queue::enqueue and the engine::queue::* views are not served; Compose gives it to the queue package of the default registry")
	} else {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.Dial(runCtx, k.Env.URL, client.Options{Name: ProviderConnectionName, Namespace: "default",
				Description: "the queue worker's enqueue provider", Version: Version, IgnoreEnv: true, Token: token,
				Logger: k.Log.Named("provider"),
				OnRegistrationError: func(err error) {
					k.Log.Error("the engine refused a provider registration", "error", err)
				}})
			if err != nil {
				if runCtx.Err() == nil {
					k.Log.Error("the provider connection failed", "error", err)
				}
				return
			}
			defer func() {
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = c.Close(cctx)
			}()
			if err := RegisterProvider(c, d); err != nil {
				k.Log.Error("the provider's functions", "error", err)
				return
			}
			provider.Store(c)
			d.poke()
			k.Log.Info("serving engine::queue::enqueue", "worker_id", c.WorkerID())
			<-runCtx.Done()
			provider.Store(nil)
		}()
	}
	if err := k.WatchConfig(ctx, func(_ context.Context, raw json.RawMessage) error {
		c, err := ParseConfig(raw)
		if err != nil {
			return err
		}
		if next, _ := c.Store(k.Env.BaseDir()); next != spec {
			k.Log.Warn("the queue adapter changed; restart the worker to switch to it (compose::restart worker=queue)")
		}
		d.SetQueues(c.QueueConfigs)
		return nil
	}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

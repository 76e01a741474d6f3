package pubsub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

// ClientInvoker fires subscribers through a connected worker: void calls,
// which the engine checks as the trigger's registrant.
type ClientInvoker struct{ C *client.Client }

// Fire calls fn in ns ("" is default) fire-and-forget.
func (ci ClientInvoker) Fire(ctx context.Context, ns, fn string, data, md json.RawMessage) error {
	if ns == "" {
		ns = "default"
	}
	opts := []client.CallOption{client.WithNamespace(ns), client.Void()}
	if !isNull(md) {
		opts = append(opts, client.WithMetadata(md))
	}
	_, err := ci.C.Call(ctx, fn, orNull(data), opts...)
	return err
}

func orNull(b json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(b)) == 0 {
		return json.RawMessage("null")
	}
	return b
}

// Broker carries a publish to the subscribers: this worker's own (local),
// or those of every pubsub worker on one Redis (redis).
type Broker interface {
	Publish(ctx context.Context, topic string, data json.RawMessage) error
	Close() error
}

// LocalBroker delivers to the hub at once.
type LocalBroker struct{ Hub *Hub }

// Publish delivers data to the topic's subscribers.
func (b LocalBroker) Publish(ctx context.Context, topic string, data json.RawMessage) error {
	b.Hub.Deliver(ctx, topic, data)
	return nil
}

// Close does nothing.
func (LocalBroker) Close() error { return nil }

// redisChannelPrefix names the Redis channels: one per topic. Ours, not
// upstream's (its channel names are not documented).
const redisChannelPrefix = "iii:pubsub:"

// redisDialWait bounds the first contact with Redis.
const redisDialWait = 5 * time.Second

// RedisBroker publishes on Redis and delivers what any worker published
// to this worker's subscribers.
type RedisBroker struct {
	c      *redis.Client
	ps     *redis.PubSub
	done   chan struct{}
	cancel context.CancelFunc
}

// OpenRedisBroker connects to Redis and starts relaying its messages to
// hub.
func OpenRedisBroker(ctx context.Context, rawURL string, hub *Hub, log hclog.Logger) (*RedisBroker, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, errorf(CodeInvalidConfig, "redis_url: %v", err)
	}
	opt.DisableIdentity = true
	c := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, redisDialWait)
	defer cancel()
	ps := c.PSubscribe(pctx, redisChannelPrefix+"*")
	if _, err := ps.Receive(pctx); err != nil {
		_ = ps.Close()
		_ = c.Close()
		return nil, errorf(CodeInvalidConfig, "redis does not answer at %s: %v", redactURL(rawURL), err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	b := &RedisBroker{c: c, ps: ps, done: make(chan struct{}), cancel: rcancel}
	go func() {
		defer close(b.done)
		for m := range ps.Channel() {
			topic := strings.TrimPrefix(m.Channel, redisChannelPrefix)
			data := json.RawMessage(m.Payload)
			if !json.Valid(data) {
				log.Warn("ignoring a Redis pubsub message that is not JSON", "channel", m.Channel)
				continue
			}
			hub.Deliver(rctx, topic, data)
		}
	}()
	return b, nil
}

// Publish is PUBLISH iii:pubsub:<topic> <data>.
func (b *RedisBroker) Publish(ctx context.Context, topic string, data json.RawMessage) error {
	return b.c.Publish(ctx, redisChannelPrefix+topic, []byte(orNull(data))).Err()
}

// Close stops relaying and disconnects.
func (b *RedisBroker) Close() error {
	err := b.ps.Close()
	<-b.done
	b.cancel()
	return errors.Join(err, b.c.Close())
}

// redactURL drops a password from a Redis URL for messages.
func redactURL(raw string) string {
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	if opt.Password != "" {
		return strings.Replace(raw, opt.Password, "****", 1)
	}
	return raw
}

// publishRequest is publish's payload.
type publishRequest struct {
	Topic  string          `json:"topic"`
	Data   json.RawMessage `json:"data"`
	Caller string          `json:"_caller_worker_id"`
}

// Service is the worker's function and trigger type over one broker.
type Service struct {
	Hub    *Hub
	Broker Broker
	dep    *deprecation
}

// NewService serves hub over broker.
func NewService(hub *Hub, broker Broker, log hclog.Logger) *Service {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Service{Hub: hub, Broker: broker, dep: newDeprecation(log, nil)}
}

// Publish handles `publish {topic, data}` → null.
func (s *Service) Publish(ctx context.Context, raw json.RawMessage) (any, error) {
	var in publishRequest
	if !isNull(raw) {
		if bytes.TrimSpace(raw)[0] != '{' || json.Unmarshal(raw, &in) != nil {
			return nil, errorf(CodeInvalidPublish, "publish takes {topic, data}, got %s", clip(raw))
		}
	}
	s.dep.warn(FunctionPublish, in.Caller)
	if in.Topic == "" {
		return nil, errorf(CodeTopicNotSet, "topic_not_set: publish needs a topic")
	}
	if err := s.Broker.Publish(ctx, in.Topic, in.Data); err != nil {
		return nil, fmt.Errorf("publish to %q: %w", in.Topic, err)
	}
	return nil, nil
}

func clip(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + "…"
	}
	return string(b)
}

// subscribeConfig is a subscribe trigger's config (upstream's).
type subscribeConfig struct {
	Topic               string `json:"topic"`
	ConditionFunctionID string `json:"condition_function_id"`
}

// RegisterTrigger subscribes the trigger's function to its topic.
func (s *Service) RegisterTrigger(_ context.Context, t client.TriggerRegistration) error {
	var cfg subscribeConfig
	if !isNull(t.Config) {
		if bytes.TrimSpace(t.Config)[0] != '{' || json.Unmarshal(t.Config, &cfg) != nil {
			return errorf(CodeInvalidConfig, "a subscribe trigger's config is {topic, condition_function_id?}, got %s", clip(t.Config))
		}
	}
	s.dep.warn(TriggerType, t.FunctionID)
	if cfg.ConditionFunctionID != "" {
		// As upstream: accepted, never evaluated. Said, so nobody relies on it.
		s.Hub.log.Warn("the subscribe trigger's condition_function_id is not evaluated (as upstream's pubsub); every publish reaches the function",
			"trigger_id", t.ID, "condition_function_id", cfg.ConditionFunctionID)
	}
	if s.Hub.Subscribe(Subscription{ID: t.ID, Topic: cfg.Topic, FunctionID: t.FunctionID, Namespace: t.Namespace, Metadata: t.Metadata}) {
		s.Hub.log.Info("subscribed", "trigger_id", t.ID, "topic", cfg.Topic, "function_id", t.FunctionID)
	}
	return nil
}

// UnregisterTrigger removes the subscription.
func (s *Service) UnregisterTrigger(_ context.Context, t client.TriggerRegistration) error {
	s.Hub.Unsubscribe(t.ID)
	return nil
}

// Register serves publish and the subscribe trigger type on c.
func (s *Service) Register(c *client.Client) error {
	if _, err := c.RegisterFunction(client.FunctionDef{ID: FunctionPublish,
		Description:   "Deprecated: publish {topic, data} to every subscribe trigger of the topic, fire and forget (use iii::durable::publish of the queue worker)",
		RequestSchema: json.RawMessage(`{"type":"object","required":["topic"],"properties":{"topic":{"type":"string","minLength":1},"data":{}}}`),
	}, func(ctx context.Context, inv *client.Invocation) (any, error) {
		return s.Publish(ctx, inv.Data)
	}); err != nil {
		return fmt.Errorf("register %s: %w", FunctionPublish, err)
	}
	if _, err := c.RegisterTriggerType(client.TriggerTypeDef{
		ID:                   TriggerType,
		Description:          "Deprecated: call a function with the data of every publish to a topic (fire and forget, no retries)",
		TriggerRequestSchema: json.RawMessage(`{"type":"object","required":["topic"],"properties":{"topic":{"type":"string"},"condition_function_id":{"type":"string"}}}`),
	}, s); err != nil {
		return fmt.Errorf("register the %s trigger type: %w", TriggerType, err)
	}
	return nil
}

// Spec is the worker's workerkit.Spec.
func Spec() workerkit.Spec {
	return workerkit.Spec{Name: Name, Version: Version, DefaultConfig: json.RawMessage(DefaultConfig),
		Description: "iii pubsub (deprecated): publish and the subscribe trigger type"}
}

// Run is the worker's life under workerkit: open the broker the
// configuration names, connect, serve, follow the configuration entry.
func Run(ctx context.Context, k *workerkit.Kit) error {
	_, spec, err := ParseConfig(k.FileConfig())
	if err != nil {
		return err
	}
	if err := k.Connect(ctx); err != nil {
		return err
	}
	hub := NewHub(ClientInvoker{C: k.Client}, k.Log)
	var broker Broker = LocalBroker{Hub: hub}
	if spec.Adapter == "redis" {
		rb, err := OpenRedisBroker(ctx, spec.RedisURL, hub, k.Log)
		if err != nil {
			return err
		}
		broker = rb
	}
	defer broker.Close()
	k.Log.Info("pubsub broker", "adapter", spec.Adapter, "version", Version)
	if err := NewService(hub, broker, k.Log).Register(k.Client); err != nil {
		return err
	}
	if err := k.WatchConfig(ctx, func(_ context.Context, raw json.RawMessage) error {
		_, next, err := ParseConfig(raw)
		if err != nil {
			return err
		}
		if next != spec {
			k.Log.Warn("the pubsub adapter changed; restart the worker to switch to it (compose::restart worker=pubsub)", "from", spec.Adapter, "to", next.Adapter)
		}
		return nil
	}); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

package queue

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/protocol"
)

// Invoker calls a function: the worker's connection (or, for enqueued
// calls, its provider connection).
type Invoker interface {
	Invoke(ctx context.Context, ns, fn string, payload, metadata json.RawMessage, timeout time.Duration) (json.RawMessage, error)
}

// DispatcherOptions configure a Dispatcher.
type DispatcherOptions struct {
	Store *Store
	// Topics delivers topic messages and calls conditions.
	Topics Invoker
	// Enqueued delivers enqueued calls (nil: none are accepted).
	Enqueued Invoker
	// Queues are the function queues of the configuration.
	Queues map[string]QueueConfig
	Logger hclog.Logger
	Now    func() time.Time
}

// Dispatcher holds the lanes of pending messages and delivers them:
// each subscription of a topic and each function queue is a lane with
// its own concurrency cap; a fifo lane delivers one message of a group at
// a time, in order, a failing one holding back the rest of its group.
type Dispatcher struct {
	mu       sync.Mutex
	store    *Store
	topics   Invoker
	enqueued Invoker
	log      hclog.Logger
	now      func() time.Time

	cfgQueues map[string]QueueConfig // from the configuration
	queues    map[string]QueueConfig // cfgQueues ∪ defined
	lanes     map[string]*lane
	subs      map[string]*subState
	triggers  map[string]string // trigger id → subscription id
	started   time.Time

	wake chan struct{}
	wg   sync.WaitGroup
}

type lane struct {
	key      string
	msgs     []*pmsg
	inflight int
}

type pmsg struct {
	Message
	inflight  bool
	notBefore time.Time // waiting for its target (no attempt spent)
}

type subState struct {
	sub  Subscription
	regs []reg
	rr   int
	// gone is when its last trigger went (zero while it has one).
	gone time.Time
}

type reg struct {
	triggerID  string
	functionID string
	namespace  string
	metadata   json.RawMessage
	config     json.RawMessage
}

// NewDispatcher loads the store's state. Run delivers.
func NewDispatcher(o DispatcherOptions) *Dispatcher {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	d := &Dispatcher{store: o.Store, topics: o.Topics, enqueued: o.Enqueued, log: o.Logger, now: o.Now,
		cfgQueues: map[string]QueueConfig{}, lanes: map[string]*lane{}, subs: map[string]*subState{},
		triggers: map[string]string{}, wake: make(chan struct{}, 1)}
	d.started = d.now()
	for k, v := range o.Queues {
		d.cfgQueues[k] = v
	}
	d.rebuildQueues()
	for _, s := range o.Store.Subs() {
		// Its triggers come back once the engine sends them again: until
		// then it is "gone" since now, so publishes still reach it.
		d.subs[s.ID] = &subState{sub: s, gone: d.started}
	}
	for _, m := range o.Store.Pending() {
		d.addLocked(m)
	}
	return d
}

func (d *Dispatcher) rebuildQueues() {
	d.queues = map[string]QueueConfig{}
	for k, v := range d.store.Defs() {
		d.queues[k] = v
	}
	for k, v := range d.cfgQueues {
		d.queues[k] = v
	}
}

// SetQueues replaces the configuration's function queues (a
// configuration change).
func (d *Dispatcher) SetQueues(qs map[string]QueueConfig) {
	d.mu.Lock()
	d.cfgQueues = map[string]QueueConfig{}
	for k, v := range qs {
		d.cfgQueues[k] = v
	}
	d.rebuildQueues()
	d.mu.Unlock()
	d.poke()
}

func laneKey(m *Message) string {
	if m.Sub != "" {
		return "s\x00" + m.Sub
	}
	return "q\x00" + m.Queue
}

func (d *Dispatcher) addLocked(m Message) {
	k := laneKey(&m)
	l := d.lanes[k]
	if l == nil {
		l = &lane{key: k}
		d.lanes[k] = l
	}
	l.msgs = append(l.msgs, &pmsg{Message: m})
}

func (d *Dispatcher) removeLocked(l *lane, pm *pmsg) {
	for i, o := range l.msgs {
		if o == pm {
			copy(l.msgs[i:], l.msgs[i+1:])
			l.msgs[len(l.msgs)-1] = nil
			l.msgs = l.msgs[:len(l.msgs)-1]
			break
		}
	}
	if len(l.msgs) == 0 && l.inflight == 0 {
		delete(d.lanes, l.key)
	}
}

func (d *Dispatcher) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// newID is a random message id (UUID v4 form).
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Publish fans data out to every subscription of topic (those whose
// triggers left less than the retention ago included); the messages are
// on disk when it returns. It returns how many subscriptions got it.
func (d *Dispatcher) Publish(topic string, data json.RawMessage) (int, error) {
	if err := checkQueueName(topic); err != nil {
		return 0, errorf(CodeTopicNotSet, "%v: publish needs {topic (or queue), data}", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	var ms []Message
	for _, id := range sortedKeys(d.subs) {
		s := d.subs[id]
		if s.sub.Topic != topic || (len(s.regs) == 0 && now.Sub(s.gone) > subscriberRetention) {
			continue
		}
		ms = append(ms, Message{ID: newID(), Seq: d.store.NextSeq(), Queue: topic, Sub: s.sub.ID, Data: orNull(data),
			MaxAttempts: s.sub.Config.MaxRetries + 1, BackoffMS: s.sub.Config.BackoffMS, CreatedAt: now})
	}
	if len(ms) == 0 {
		d.log.Debug("published to a topic without subscribers: dropped", "topic", topic)
		return 0, nil
	}
	if err := d.store.PutAll(ms); err != nil {
		return 0, err
	}
	for _, m := range ms {
		d.addLocked(m)
	}
	d.poke()
	return len(ms), nil
}

// EnqueueRequest is what the engine hands engine::queue::enqueue.
type EnqueueRequest struct {
	Queue       string          `json:"queue"`
	FunctionID  string          `json:"function_id"`
	Data        json.RawMessage `json:"data"`
	ReceiptID   string          `json:"messageReceiptId"`
	Traceparent *string         `json:"traceparent,omitempty"`
	Baggage     *string         `json:"baggage,omitempty"`
	Namespace   string          `json:"namespace,omitempty"`
}

// Enqueue accepts an enqueued call into its function queue.
func (d *Dispatcher) Enqueue(r EnqueueRequest) (string, error) {
	if err := checkQueueName(r.Queue); err != nil {
		return "", errorf(CodeInvalidArgument, "%v: an enqueue action needs {type: \"enqueue\", queue: <name>}", err)
	}
	if r.FunctionID == "" {
		return "", errorf(CodeInvalidArgument, "the enqueue names no function_id")
	}
	if d.enqueued == nil {
		return "", errorf(CodeStoreUnavailable, "this queue worker has no provider connection")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	cfg, ok := d.queues[r.Queue]
	if !ok {
		return "", &protocol.ErrorBody{Code: CodeNotProvisioned, Message: fmt.Sprintf("function queue '%s' is not provisioned", clip(r.Queue))}
	}
	group := ""
	if cfg.Type == queueTypeFIFO {
		g, err := groupOf(r.Data, cfg.MessageGroupField)
		if err != nil {
			return "", errorf(CodeInvalidArgument, "fifo queue '%s': %v", clip(r.Queue), err)
		}
		group = g
	}
	now := d.now()
	m := Message{ID: newID(), Seq: d.store.NextSeq(), Queue: r.Queue, FunctionID: r.FunctionID, Namespace: r.Namespace,
		Data: orNull(r.Data), MaxAttempts: *cfg.MaxRetries + 1, BackoffMS: *cfg.BackoffMS, CreatedAt: now, GroupID: group,
		ReceiptID: r.ReceiptID}
	if r.Traceparent != nil {
		m.Traceparent = *r.Traceparent
	}
	if r.Baggage != nil {
		m.Baggage = *r.Baggage
	}
	if m.ReceiptID == "" {
		m.ReceiptID = m.ID
	}
	if err := d.store.Put(m); err != nil {
		return "", err
	}
	d.addLocked(m)
	d.poke()
	return m.ReceiptID, nil
}

// groupOf is a fifo message's group: the value of field in data.
func groupOf(data json.RawMessage, field string) (string, error) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) != nil {
		return "", fmt.Errorf("its message_group_field %q needs the data to be an object", field)
	}
	v, ok := obj[field]
	if !ok || bytes.Equal(v, []byte("null")) {
		return "", fmt.Errorf("the data has no %q (its message_group_field)", field)
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s, nil
	}
	return string(v), nil
}

// Define provisions (or changes) a function queue at run time; changed
// reports whether it differs from what was there.
func (d *Dispatcher) Define(name string, raw json.RawMessage) (bool, error) {
	if err := checkQueueName(name); err != nil {
		return false, errorf(CodeInvalidArgument, "queue::define: %v", err)
	}
	cfg, err := ParseQueueConfig(raw)
	if err != nil {
		return false, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old, ok := d.queues[name]
	if ok && sameJSON(old, cfg) {
		return false, nil
	}
	if err := d.store.Define(name, cfg); err != nil {
		return false, err
	}
	d.rebuildQueues()
	d.poke()
	return true, nil
}

func sameJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// SubscriptionID is who a durable:subscriber trigger delivers to: its
// consumer group, else its binding (metadata.__binding), else its
// function, on its topic.
func SubscriptionID(topic, group, binding, ns, fn string) string {
	switch {
	case group != "":
		return topic + "\x00group\x00" + group
	case binding != "":
		return topic + "\x00binding\x00" + binding
	}
	return topic + "\x00fn\x00" + ns + "\x00" + fn
}

// Subscribe registers a durable:subscriber trigger.
func (d *Dispatcher) Subscribe(triggerID, fn, ns string, config, metadata json.RawMessage) error {
	cfg, err := ParseSubscriber(config)
	if err != nil {
		return err
	}
	var md struct {
		Binding string `json:"__binding"`
	}
	_ = json.Unmarshal(metadata, &md)
	id := SubscriptionID(cfg.Queue, cfg.Group, md.Binding, ns, fn)
	r := reg{triggerID: triggerID, functionID: fn, namespace: ns, metadata: metadata, config: config}
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.triggers[triggerID]; ok {
		s := d.subs[old]
		for i, o := range s.regs {
			if o.triggerID == triggerID {
				if old == id && o.functionID == fn && o.namespace == ns && bytes.Equal(o.config, config) {
					s.regs[i] = r // sent again after a reconnect
					return nil
				}
			}
		}
		return errorf(CodeAlreadyRegistered, "trigger %q is already registered with another config", clip(triggerID))
	}
	s := d.subs[id]
	sub := Subscription{ID: id, Topic: cfg.Queue, Config: cfg, Seen: d.now()}
	if s == nil || !sameJSON(s.sub.Config, cfg) {
		if err := d.store.PutSub(sub); err != nil {
			return err
		}
	}
	if s == nil {
		s = &subState{}
		d.subs[id] = s
	}
	s.sub, s.gone = sub, time.Time{}
	s.regs = append(s.regs, r)
	d.triggers[triggerID] = id
	d.poke()
	return nil
}

// Unsubscribe removes a trigger. Its subscription's messages stay (they
// are delivered when a trigger of it comes back, or dropped from the
// views with discard); new publishes reach it for the retention.
func (d *Dispatcher) Unsubscribe(triggerID string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	id, ok := d.triggers[triggerID]
	if !ok {
		return false
	}
	delete(d.triggers, triggerID)
	s := d.subs[id]
	for i, o := range s.regs {
		if o.triggerID == triggerID {
			s.regs = append(s.regs[:i:i], s.regs[i+1:]...)
			break
		}
	}
	if len(s.regs) == 0 {
		s.gone = d.now()
	}
	return true
}

// sweepLocked forgets subscriptions without triggers past the retention
// that hold no messages.
func (d *Dispatcher) sweepLocked(now time.Time) {
	for id, s := range d.subs {
		if len(s.regs) > 0 || now.Sub(s.gone) <= subscriberRetention {
			continue
		}
		if l := d.lanes["s\x00"+id]; l != nil && len(l.msgs) > 0 {
			continue
		}
		if err := d.store.DelSub(id); err != nil {
			d.log.Warn("could not forget a subscription", "topic", s.sub.Topic, "error", err)
			continue
		}
		delete(d.subs, id)
	}
}

// limitsLocked are a lane's concurrency and whether it is fifo.
func (d *Dispatcher) limitsLocked(l *lane) (int, bool) {
	if len(l.msgs) == 0 {
		return 0, false
	}
	m := l.msgs[0]
	if m.Sub != "" {
		s := d.subs[m.Sub]
		if s == nil {
			return 0, false
		}
		return s.sub.Config.Concurrency, s.sub.Config.Type == queueTypeFIFO
	}
	cfg, ok := d.queues[m.Queue]
	if !ok {
		cfg, _ = QueueConfig{}.normalize()
	}
	return *cfg.Concurrency, cfg.Type == queueTypeFIFO
}

// readyLocked reports whether m's target can be called now.
func (d *Dispatcher) readyLocked(m *pmsg) bool {
	if m.Sub != "" {
		s := d.subs[m.Sub]
		return s != nil && len(s.regs) > 0
	}
	return d.enqueued != nil
}

// Run delivers until ctx ends, then waits for the deliveries under way
// (they end with ctx: their messages stay pending).
func (d *Dispatcher) Run(ctx context.Context) {
	defer d.wg.Wait()
	sweep := time.NewTicker(subscriberRetention / 3)
	defer sweep.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := d.dispatch(ctx)
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(d.now()), time.Millisecond)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-timer.C:
		case <-sweep.C:
			d.mu.Lock()
			d.sweepLocked(d.now())
			d.mu.Unlock()
		}
	}
}

// dispatch starts every delivery that may start now and returns when the
// next waiting one is due (zero: none waits on time).
func (d *Dispatcher) dispatch(ctx context.Context) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ctx.Err() != nil {
		return time.Time{}
	}
	now := d.now()
	var next time.Time
	due := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, l := range d.lanes {
		limit, fifo := d.limitsLocked(l)
		var blocked map[string]bool
		if fifo {
			blocked = map[string]bool{}
		}
		for _, pm := range l.msgs {
			if l.inflight >= limit {
				break
			}
			if fifo {
				if blocked[pm.GroupID] {
					continue
				}
				blocked[pm.GroupID] = true
			}
			if pm.inflight || !d.readyLocked(pm) {
				continue
			}
			at := pm.ProcessAt
			if pm.notBefore.After(at) {
				at = pm.notBefore
			}
			if at.After(now) {
				due(at)
				continue
			}
			pm.inflight = true
			l.inflight++
			d.wg.Add(1)
			go d.deliver(ctx, l, pm, d.targetLocked(pm))
		}
	}
	return next
}

// target is where one delivery goes.
type target struct {
	inv       Invoker
	ns, fn    string
	metadata  json.RawMessage
	condition string
	timeout   time.Duration
}

func (d *Dispatcher) targetLocked(pm *pmsg) target {
	if pm.Sub != "" {
		s := d.subs[pm.Sub]
		r := s.regs[s.rr%len(s.regs)]
		s.rr++
		return target{inv: d.topics, ns: r.namespace, fn: r.functionID, metadata: r.metadata,
			condition: s.sub.Config.Condition, timeout: DefaultTimeoutMS * time.Millisecond}
	}
	cfg, ok := d.queues[pm.Queue]
	if !ok {
		cfg, _ = QueueConfig{}.normalize()
	}
	return target{inv: d.enqueued, ns: pm.Namespace, fn: pm.FunctionID, timeout: time.Duration(*cfg.TimeoutMS) * time.Millisecond}
}

// outcome of one delivery.
type outcome int

const (
	delivered outcome = iota
	failed            // the target failed: an attempt spent
	notReady          // the target is not there (or the engine is not): none spent
	stopped           // the worker is stopping
)

func (d *Dispatcher) deliver(ctx context.Context, l *lane, pm *pmsg, t target) {
	defer d.wg.Done()
	res, errText := d.call(ctx, pm, t)
	d.finish(l, pm, res, errText)
}

// call makes the delivery: the condition first, when there is one.
func (d *Dispatcher) call(ctx context.Context, pm *pmsg, t target) (outcome, string) {
	classify := func(err error) (outcome, string) {
		if ctx.Err() != nil {
			return stopped, ""
		}
		var eb *protocol.ErrorBody
		if !errors.As(err, &eb) {
			return notReady, err.Error() // the connection, not the target
		}
		if eb.Code == protocol.CodeFunctionNotFound || eb.Code == protocol.CodeInvocationStopped {
			// Not registered, or its worker (or the engine) went away
			// mid-call: the target's absence, not its failure.
			return notReady, eb.Message
		}
		return failed, eb.Code + ": " + eb.Message
	}
	if t.condition != "" {
		out, err := t.inv.Invoke(ctx, t.ns, t.condition, pm.Data, t.metadata, t.timeout)
		if err != nil {
			return classify(err)
		}
		if bytes.Equal(bytes.TrimSpace(out), []byte("false")) {
			return delivered, ""
		}
	}
	if _, err := t.inv.Invoke(ctx, t.ns, t.fn, pm.Data, t.metadata, t.timeout); err != nil {
		return classify(err)
	}
	return delivered, ""
}

func (d *Dispatcher) finish(l *lane, pm *pmsg, res outcome, errText string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.poke()
	pm.inflight = false
	l.inflight--
	now := d.now()
	switch res {
	case delivered:
		if err := d.store.Ack(pm.ID); err != nil {
			d.log.Warn("could not record a delivery: it may be delivered again", "queue", pm.Queue, "id", pm.ID, "error", err)
		}
		d.removeLocked(l, pm)
	case notReady:
		pm.notBefore = now.Add(notReadyRetry)
		d.log.Debug("target not reachable: delivery waits", "queue", pm.Queue, "function_id", pm.FunctionID, "reason", errText)
	case failed:
		pm.Attempts++
		pm.LastError = errText
		if pm.Attempts >= pm.MaxAttempts {
			e := DLQEntry{Job: pm.Message, Error: errText, FailedAt: now}
			if err := d.store.ToDLQ(e); err != nil {
				d.log.Warn("could not move a message to the DLQ", "queue", pm.Queue, "id", pm.ID, "error", err)
				return
			}
			d.log.Warn("message moved to the DLQ", "queue", pm.Queue, "id", pm.ID, "attempts", pm.Attempts, "error", errText)
			d.removeLocked(l, pm)
			return
		}
		pm.ProcessAt = now.Add(Backoff(pm.BackoffMS, pm.Attempts))
		if err := d.store.Put(pm.Message); err != nil {
			d.log.Warn("could not record a failed attempt", "queue", pm.Queue, "id", pm.ID, "error", err)
		}
		d.log.Debug("delivery failed: retrying", "queue", pm.Queue, "id", pm.ID, "attempt", pm.Attempts, "next", pm.ProcessAt)
	case stopped:
	}
}

// Redrive moves every DLQ entry of queue back to pending (attempts
// reset) and returns how many.
func (d *Dispatcher) Redrive(queue string) (int, error) {
	if err := checkQueueName(queue); err != nil {
		return 0, errorf(CodeInvalidArgument, "%v", err)
	}
	n := 0
	for _, e := range d.store.DLQ(queue) {
		if err := d.redrive(e); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// RedriveMessage moves one DLQ entry of queue back to pending.
func (d *Dispatcher) RedriveMessage(queue, id string) error {
	e, err := d.dlqEntry(queue, id)
	if err != nil {
		return err
	}
	return d.redrive(e)
}

// Discard drops one DLQ entry of queue.
func (d *Dispatcher) Discard(queue, id string) error {
	if _, err := d.dlqEntry(queue, id); err != nil {
		return err
	}
	return d.store.Discard(id)
}

func (d *Dispatcher) dlqEntry(queue, id string) (DLQEntry, error) {
	if err := checkQueueName(queue); err != nil {
		return DLQEntry{}, errorf(CodeInvalidArgument, "%v", err)
	}
	if id == "" {
		return DLQEntry{}, errorf(CodeInvalidArgument, "message_id is empty")
	}
	e, ok := d.store.DLQEntry(id)
	if !ok || e.Job.Queue != queue {
		return DLQEntry{}, errorf(CodeMessageNotFound, "message %q is not in the DLQ of %q", clip(id), clip(queue))
	}
	return e, nil
}

func (d *Dispatcher) redrive(e DLQEntry) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := e.Job
	m.Attempts, m.ProcessAt, m.LastError, m.Seq = 0, time.Time{}, "", d.store.NextSeq()
	if err := d.store.Redrive(m.ID, m); err != nil {
		return err
	}
	d.addLocked(m)
	d.poke()
	return nil
}

// TopicInfo is one entry of engine::queue::list_topics.
type TopicInfo struct {
	Name            string `json:"name"`
	BrokerType      string `json:"broker_type"`
	SubscriberCount int    `json:"subscriber_count"`
}

// Topics lists the topics and function queues.
func (d *Dispatcher) Topics() []TopicInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	count := map[string]int{}
	for _, s := range d.subs {
		count[s.sub.Topic] += len(s.regs)
	}
	for q := range d.queues {
		if _, ok := count[q]; !ok {
			count[q] = 0
		}
	}
	for _, l := range d.lanes {
		if len(l.msgs) > 0 {
			if _, ok := count[l.msgs[0].Queue]; !ok {
				count[l.msgs[0].Queue] = 0
			}
		}
	}
	out := make([]TopicInfo, 0, len(count))
	for _, n := range sortedKeys(count) {
		out = append(out, TopicInfo{Name: n, BrokerType: "builtin", SubscriberCount: count[n]})
	}
	return out
}

// DLQTopic is one entry of engine::queue::dlq_topics.
type DLQTopic struct {
	Name         string `json:"name"`
	BrokerType   string `json:"broker_type"`
	MessageCount int    `json:"message_count"`
}

// DLQTopics lists the queues with dead letters.
func (d *Dispatcher) DLQTopics() []DLQTopic {
	counts := d.store.DLQCounts()
	out := make([]DLQTopic, 0, len(counts))
	for _, n := range sortedKeys(counts) {
		out = append(out, DLQTopic{Name: n, BrokerType: "builtin", MessageCount: counts[n]})
	}
	return out
}

// TopicStats is engine::queue::topic_stats's answer.
type TopicStats struct {
	Depth         int `json:"depth"`
	ConsumerCount int `json:"consumer_count"`
	DLQDepth      int `json:"dlq_depth"`
	Config        any `json:"config"`
}

// Stats describes one topic or function queue.
func (d *Dispatcher) Stats(name string) (TopicStats, error) {
	if err := checkQueueName(name); err != nil {
		return TopicStats{}, errorf(CodeInvalidArgument, "%v", err)
	}
	dlq := len(d.store.DLQ(name))
	d.mu.Lock()
	defer d.mu.Unlock()
	st := TopicStats{DLQDepth: dlq}
	for _, l := range d.lanes {
		for _, m := range l.msgs {
			if m.Queue == name {
				st.Depth++
			}
		}
	}
	var subs []SubscriberConfig
	for _, id := range sortedKeys(d.subs) {
		if s := d.subs[id]; s.sub.Topic == name {
			st.ConsumerCount += len(s.regs)
			subs = append(subs, s.sub.Config)
		}
	}
	if q, ok := d.queues[name]; ok {
		st.Config = q
	} else if len(subs) > 0 {
		st.Config = map[string]any{"subscribers": subs}
	}
	return st, nil
}

// DLQItem is one entry of engine::queue::dlq_messages.
type DLQItem struct {
	ID        string          `json:"id"`
	Payload   json.RawMessage `json:"payload"`
	Error     string          `json:"error"`
	FailedAt  time.Time       `json:"failed_at"`
	Retries   int             `json:"retries"`
	SizeBytes int             `json:"size_bytes"`
	Job       Message         `json:"job"`
}

// DLQMessages pages through queue's dead letters, oldest first.
func (d *Dispatcher) DLQMessages(queue string, offset, limit int) ([]DLQItem, error) {
	if err := checkQueueName(queue); err != nil {
		return nil, errorf(CodeInvalidArgument, "%v", err)
	}
	if offset < 0 || limit < 0 {
		return nil, errorf(CodeInvalidArgument, "offset and limit must not be negative")
	}
	if limit == 0 {
		limit = defaultDLQPage
	}
	limit = min(limit, maxDLQPage)
	es := d.store.DLQ(queue)
	if offset >= len(es) {
		return []DLQItem{}, nil
	}
	es = es[offset:min(len(es), offset+limit)]
	out := make([]DLQItem, 0, len(es))
	for _, e := range es {
		out = append(out, DLQItem{ID: e.Job.ID, Payload: e.Job.Data, Error: e.Error, FailedAt: e.FailedAt,
			Retries: e.Job.Attempts, SizeBytes: len(e.Job.Data), Job: e.Job})
	}
	return out, nil
}

// InFlight is the number of deliveries under way (tests).
func (d *Dispatcher) InFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, l := range d.lanes {
		n += l.inflight
	}
	return n
}

func orNull(b json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(b)) == 0 {
		return json.RawMessage("null")
	}
	return b
}

package client

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/iii-sandbox/iii/protocol"
)

// CallOption adjusts one Call.
type CallOption func(*callOptions)

type callOptions struct {
	namespace *string
	timeout   time.Duration
	void      bool
	metadata  json.RawMessage
}

// WithNamespace resolves the function in ns instead of the worker's own
// namespace.
func WithNamespace(ns string) CallOption {
	return func(o *callOptions) { o.namespace = &ns }
}

// WithTimeout bounds the wait for the result (default Options.CallTimeout,
// 30 s). On expiry Call fails with code TIMEOUT.
func WithTimeout(d time.Duration) CallOption {
	return func(o *callOptions) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// Void makes the call fire-and-forget: it returns once the frame is written
// and the engine sends nothing back.
func Void() CallOption {
	return func(o *callOptions) { o.void = true }
}

// WithMetadata attaches the invocation's metadata sidecar.
func WithMetadata(m json.RawMessage) CallOption {
	return func(o *callOptions) { o.metadata = m }
}

func newPendingCall(id, function string, frame []byte, timeout time.Duration) *pendingCall {
	return &pendingCall{id: id, function: function, frame: frame, timeout: timeout, done: make(chan struct{})}
}

// Call invokes functionID with payload (nil for none; a json.RawMessage is
// sent as is; anything else is JSON-encoded) and waits for its result. A
// null result comes back as nil. Errors: a *protocol.ErrorBody from the
// engine or the function (code as sent), or an *Error with code TIMEOUT,
// CONNECTION_LOST or CLIENT_CLOSED.
//
// engine::* functions always resolve in "default"; any other function
// resolves in the worker's namespace unless WithNamespace says otherwise.
func (c *Client) Call(ctx context.Context, functionID string, payload any, opts ...CallOption) (json.RawMessage, error) {
	if functionID == "" {
		return nil, &Error{Code: CodeInvalidArgument, Message: "call: empty function id"}
	}
	o := callOptions{timeout: c.opts.CallTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	data, err := marshalValue(payload)
	if err != nil {
		return nil, &Error{Code: CodeSerialization, Message: fmt.Sprintf("call %s: encode payload: %v", functionID, err), Err: err}
	}
	var meta json.RawMessage
	if o.metadata != nil {
		if meta, err = marshalValue(o.metadata); err != nil {
			return nil, &Error{Code: CodeSerialization, Message: fmt.Sprintf("call %s: encode metadata: %v", functionID, err), Err: err}
		}
	}
	msg := &protocol.InvokeFunction{FunctionID: functionID, Data: data, Metadata: meta, Namespace: c.callNamespace(functionID, o.namespace)}
	if o.void {
		msg.Action = &protocol.TriggerAction{Type: protocol.ActionVoid}
	} else {
		msg.InvocationID = uuid.NewString()
	}
	frame, err := protocol.EncodeFast(msg)
	if err != nil {
		return nil, &Error{Code: CodeSerialization, Message: fmt.Sprintf("call %s: %v", functionID, err), Err: err}
	}
	pc := newPendingCall(msg.InvocationID, functionID, frame, o.timeout)
	c.send(pc)
	return pc.result, c.await(ctx, pc)
}

// callNamespace applies the SDK rule: an explicit namespace wins; engine::*
// never carries the worker's namespace (builtins live in "default");
// everything else carries it.
func (c *Client) callNamespace(functionID string, explicit *string) *string {
	if explicit != nil {
		return explicit
	}
	if c.opts.Namespace == "" || strings.HasPrefix(functionID, enginePrefix) {
		return nil
	}
	ns := c.opts.Namespace
	return &ns
}

// await waits for pc until its timeout or ctx, and returns its error.
func (c *Client) await(ctx context.Context, pc *pendingCall) error {
	select {
	case <-pc.done:
		return pc.err
	default:
	}
	t := time.NewTimer(pc.timeout)
	defer t.Stop()
	var giveUp error
	select {
	case <-pc.done:
		return pc.err
	case <-t.C:
		if pc.id == "" {
			giveUp = &Error{Code: CodeTimeout, Message: fmt.Sprintf("could not send %s to the engine within %d ms", pc.function, pc.timeout.Milliseconds())}
		} else {
			giveUp = &Error{Code: CodeTimeout, Message: fmt.Sprintf("no result from %s within %d ms", pc.function, pc.timeout.Milliseconds())}
		}
	case <-ctx.Done():
		giveUp = fmt.Errorf("call %s: %w", pc.function, ctx.Err())
	}
	c.mu.Lock()
	c.finishLocked(pc, nil, giveUp) // no-op if the result won the race
	c.mu.Unlock()
	return pc.err
}

// send hands pc's frame to the live connection, or queues it until one is
// ready.
func (c *Client) send(pc *pendingCall) {
	c.mu.Lock()
	if c.stopErr != nil {
		c.finishLocked(pc, nil, c.stopErr)
		c.mu.Unlock()
		return
	}
	if pc.id != "" {
		c.pending[pc.id] = pc
	}
	s := c.sess
	if s == nil || !s.ready {
		pc.state = callQueued
		c.queue = append(c.queue, &outFrame{data: pc.frame, call: pc})
		c.mu.Unlock()
		return
	}
	pc.state, pc.sess = callWriting, s
	c.mu.Unlock()
	c.deliver(s, pc)
}

// deliver writes pc on s (pc is callWriting on s). A failed write means the
// engine never got the whole frame, so the call is not lost: it moves to
// the next ready connection, or back to the queue.
func (c *Client) deliver(s *session, pc *pendingCall) {
	for s != nil {
		err := s.write(pc.frame)
		c.mu.Lock()
		if err == nil {
			c.wroteLocked(s, pc)
			c.mu.Unlock()
			return
		}
		s = c.retryLocked(s, pc)
		c.mu.Unlock()
	}
}

// retryLocked decides where a call whose write failed on failed goes next:
// it returns a newer ready session to write on, or nil after queueing (or
// finishing) it. c.mu must be held.
func (c *Client) retryLocked(failed *session, pc *pendingCall) *session {
	if pc.state == callDone {
		return nil
	}
	if c.stopErr != nil {
		c.finishLocked(pc, nil, c.stopErr)
		return nil
	}
	if cur := c.sess; cur != nil && cur != failed && cur.ready {
		pc.state, pc.sess = callWriting, cur
		return cur
	}
	pc.state, pc.sess = callQueued, nil
	c.queue = append([]*outFrame{{data: pc.frame, call: pc}}, c.queue...)
	return nil
}

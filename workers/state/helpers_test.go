package state

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/protocol"
)

func codeOf(t *testing.T, err error) string {
	t.Helper()
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb), "not an ErrorBody: %v", err)
	return eb.Code
}

// call is one invocation a recordingInvoker saw.
type call struct {
	ns, fn   string
	payload  map[string]any
	metadata string
}

// recordingInvoker answers conditions from conds (by function id; a
// missing one fails) and records every call on calls.
type recordingInvoker struct {
	mu    sync.Mutex
	conds map[string]string
	calls chan call
}

func newRecorder(conds map[string]string) *recordingInvoker {
	return &recordingInvoker{conds: conds, calls: make(chan call, 64)}
}

func (r *recordingInvoker) Invoke(_ context.Context, ns, fn string, payload, md json.RawMessage) (json.RawMessage, error) {
	var p map[string]any
	_ = json.Unmarshal(payload, &p)
	r.calls <- call{ns: ns, fn: fn, payload: p, metadata: string(md)}
	if len(fn) > 5 && fn[:5] == "cond:" {
		r.mu.Lock()
		ans, ok := r.conds[fn]
		r.mu.Unlock()
		if !ok {
			return nil, errors.New("condition failed")
		}
		return json.RawMessage(ans), nil
	}
	return json.RawMessage(`null`), nil
}

func triggerReg(id, fn, ns, cfg, md string) client.TriggerRegistration {
	r := client.TriggerRegistration{ID: id, TriggerType: TriggerType, FunctionID: fn, Namespace: ns}
	if cfg != "" {
		r.Config = json.RawMessage(cfg)
	}
	if md != "" {
		r.Metadata = json.RawMessage(md)
	}
	return r
}

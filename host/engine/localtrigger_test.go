package engine

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/protocol"
)

// recordingProvider is a TriggerProvider that keeps what it was told.
type recordingProvider struct {
	mu     sync.Mutex
	live   map[string]TriggerBinding
	refuse string // a function id whose bindings it refuses
}

func (p *recordingProvider) RegisterTrigger(b TriggerBinding) error {
	if b.FunctionID == p.refuse {
		return errors.New("refused: " + b.FunctionID)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.live[b.ID] = b
	return nil
}

func (p *recordingProvider) UnregisterTrigger(b TriggerBinding) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.live, b.ID)
}

func (p *recordingProvider) has(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.live[id]
	return ok
}

func TestLocalTriggerProvider(t *testing.T) {
	te := startEngine(t, Options{})
	origin := te.dial(t)
	origin.registerIn("", "origin", "job::run", "job::bad")

	// Registered before the type exists: parked, then handed over.
	origin.send(&protocol.RegisterTrigger{ID: "early", TriggerType: "local-x", FunctionID: "job::run", Config: json.RawMessage(`{"k":1}`)})
	origin.sync()

	lw, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "local-provider"})
	assert.NilError(t, err)
	p := &recordingProvider{live: map[string]TriggerBinding{}, refuse: "job::bad"}
	assert.NilError(t, lw.RegisterTriggerType("local-x", "a local type", p))
	pollUntil(t, "parked binding handed over", func() bool { return p.has("early") })
	p.mu.Lock()
	got := p.live["early"]
	p.mu.Unlock()
	assert.Equal(t, got.FunctionID, "job::run")
	assert.Equal(t, got.Namespace, DefaultNamespace)
	assert.Equal(t, string(got.Config), `{"k":1}`)

	// A refusal reaches the originator as a registration error.
	origin.send(&protocol.RegisterTrigger{ID: "bad", TriggerType: "local-x", FunctionID: "job::bad"})
	res := origin.expect("triggerregistrationresult")
	assert.Equal(t, res.str("id"), "bad")
	_, msg := errBody(t, res)
	assert.Equal(t, msg, "refused: job::bad")

	// Withdrawn by its originator.
	origin.send(&protocol.UnregisterTrigger{ID: "early", TriggerType: "local-x"})
	pollUntil(t, "binding withdrawn", func() bool { return !p.has("early") })

	// The provider detaching parks the bindings; a new provider gets them.
	origin.send(&protocol.RegisterTrigger{ID: "again", TriggerType: "local-x", FunctionID: "job::run"})
	pollUntil(t, "binding registered", func() bool { return p.has("again") })
	lw.Detach()
	lw2, err := te.AttachLocalWorker(LocalWorkerSpec{Name: "local-provider"})
	assert.NilError(t, err)
	p2 := &recordingProvider{live: map[string]TriggerBinding{}}
	assert.NilError(t, lw2.RegisterTriggerType("local-x", "", p2))
	pollUntil(t, "binding moved to the new provider", func() bool { return p2.has("again") })
	assert.Assert(t, te.HasFunction("", "job::run"))
	assert.Assert(t, !te.HasFunction("", "job::nope"))
	lw2.Detach()
}

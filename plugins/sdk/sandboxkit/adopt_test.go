package sandboxkit

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
)

// adoptingProvider is the fake provider whose sandboxes outlive the
// Manager: a "restart" is a new Manager over a provider that hands back
// what the previous one detached.
type adoptingProvider struct {
	*fakeProvider
	keep bool

	amu      sync.Mutex
	leftover []Adopted
	detached []detachedSandbox
}

type detachedSandbox struct {
	sb   *fakeSandbox
	last time.Time
}

func (p *adoptingProvider) CanPause() bool { return true }

func (p *adoptingProvider) AdoptSandboxes(context.Context) ([]Adopted, error) {
	p.amu.Lock()
	defer p.amu.Unlock()
	out := p.leftover
	p.leftover = nil
	return out, nil
}

func (p *adoptingProvider) KeepsSandboxes() bool { return p.keep }

// Boot hands out detachable sandboxes.
func (p *adoptingProvider) Boot(ctx context.Context, spec BootSpec) (Sandbox, error) {
	sb, err := p.fakeProvider.Boot(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &detachableSandbox{fakeSandbox: sb.(*fakeSandbox), p: p}, nil
}

type detachableSandbox struct {
	*fakeSandbox
	p *adoptingProvider
}

func (s *detachableSandbox) Detach(_ context.Context, last time.Time) error {
	s.p.amu.Lock()
	defer s.p.amu.Unlock()
	s.p.detached = append(s.p.detached, detachedSandbox{s.fakeSandbox, last})
	return nil
}

func configured(t *testing.T, p Provider, cfg map[string]any) *Manager {
	t.Helper()
	m := New(p, Options{Name: "fake", Version: "1.0.0"})
	raw, err := json.Marshal(cfg)
	assert.NilError(t, err)
	assert.NilError(t, m.Configure(ctx, raw))
	return m
}

// A provider that keeps sandboxes: Shutdown detaches instead of stopping,
// and the next Manager adopts them under their ids, with their names,
// images, idle timeouts and pause state; they count toward the limit at
// once and answer operations.
func TestAdoptionAcrossManagers(t *testing.T) {
	p := &adoptingProvider{fakeProvider: newFakeProvider(), keep: true}
	cfg := map[string]any{"image_allowlist": []string{"python"}, "max_concurrent_sandboxes": 2}
	m1 := configured(t, p, cfg)
	a, err := m1.Create(ctx, &contract.CreateRequest{Image: "python", Name: "keep-me", IdleTimeoutSecs: new(uint64(600))})
	assert.NilError(t, err)
	b, err := m1.Create(ctx, &contract.CreateRequest{Image: "python"})
	assert.NilError(t, err)
	_, err = m1.Pause(ctx, &contract.PauseRequest{SandboxID: b.SandboxID})
	assert.NilError(t, err)
	assert.NilError(t, m1.Shutdown(ctx))

	assert.Equal(t, len(p.detached), 2)
	for _, d := range p.detached {
		assert.Equal(t, d.sb.stops(), 0, "a kept sandbox is detached, not stopped")
		p.leftover = append(p.leftover, Adopted{
			Sandbox: &detachableSandbox{fakeSandbox: d.sb, p: p}, ID: d.sb.spec.ID, Name: d.sb.spec.Name,
			Image: d.sb.spec.Image.Name, IdleTimeout: d.sb.spec.IdleTimeout, LastActivity: d.last,
			Paused: d.sb.spec.ID == b.SandboxID,
		})
	}
	assert.Equal(t, p.sandbox(a.SandboxID).spec.IdleTimeout, 600*time.Second, "the provider is told the idle timeout to record")

	p.keep = false
	m2 := configured(t, p, cfg)
	defer func() { assert.NilError(t, m2.Shutdown(ctx)) }()
	list, err := m2.List(ctx, &contract.ListRequest{})
	assert.NilError(t, err)
	assert.Equal(t, len(list.Sandboxes), 2)
	for _, s := range list.Sandboxes {
		switch s.SandboxID {
		case a.SandboxID:
			assert.Equal(t, s.Name, "keep-me")
			assert.Equal(t, s.Paused, false)
		case b.SandboxID:
			assert.Equal(t, s.Paused, true)
		}
		assert.Equal(t, s.Image, "python")
	}
	_, err = m2.Exec(ctx, &contract.ExecRequest{SandboxID: a.SandboxID, Argv: []string{"echo", "hi"}})
	assert.NilError(t, err)
	_, err = m2.Exec(ctx, &contract.ExecRequest{SandboxID: b.SandboxID, Argv: []string{"echo", "hi"}})
	assert.Equal(t, code(t, err), contract.S005, "an adopted paused sandbox is still paused")
	_, err = m2.Create(ctx, &contract.CreateRequest{Image: "python"})
	assert.Equal(t, code(t, err), contract.S400, "adopted sandboxes count toward max_concurrent_sandboxes")
	_, err = m2.Resume(ctx, &contract.ResumeRequest{SandboxID: b.SandboxID})
	assert.NilError(t, err)

	// Without KeepsSandboxes, Shutdown stops them as before.
	assert.NilError(t, m2.Shutdown(ctx))
	assert.Equal(t, p.sandbox(a.SandboxID).stops(), 1)
}

// What cannot be adopted (not a UUID, a duplicate, a paused sandbox that
// cannot resume) is stopped, not registered.
func TestAdoptionRefusesBadEntries(t *testing.T) {
	p := &adoptingProvider{fakeProvider: newFakeProvider()}
	id := uuid.NewString()
	mk := func(id string) *fakeSandbox {
		return &fakeSandbox{spec: BootSpec{ID: id}, files: map[string]string{}, done: make(chan struct{})}
	}
	good, dup, bad := mk(id), mk(id), mk("not-a-uuid")
	p.leftover = []Adopted{
		{Sandbox: good, ID: id, Image: "python"},
		{Sandbox: dup, ID: id, Image: "python"},
		{Sandbox: bad, ID: "not-a-uuid", Image: "python"},
	}
	m := configured(t, p, map[string]any{"image_allowlist": []string{"python"}})
	list, err := m.List(ctx, &contract.ListRequest{})
	assert.NilError(t, err)
	assert.Equal(t, len(list.Sandboxes), 1)
	assert.NilError(t, m.Shutdown(ctx))
	assert.Equal(t, dup.stops(), 1)
	assert.Equal(t, bad.stops(), 1)
	assert.Equal(t, good.stops(), 1)
}

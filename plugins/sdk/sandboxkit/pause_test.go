package sandboxkit

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/contract"
)

// pausingProvider is the fake provider with pausable sandboxes.
type pausingProvider struct{ *fakeProvider }

func (pausingProvider) CanPause() bool { return true }

func (s *fakeSandbox) Pause(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused {
		return errors.New("paused twice")
	}
	if s.pauseErr != nil {
		return s.pauseErr
	}
	s.paused = true
	s.pauses++
	return nil
}

func (s *fakeSandbox) Resume(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.paused {
		return errors.New("resumed while running")
	}
	s.paused = false
	s.resumes++
	return nil
}

func newPausingManager(t *testing.T, cfg map[string]any) (*Manager, *fakeProvider) {
	t.Helper()
	p := newFakeProvider()
	m := New(pausingProvider{p}, Options{Name: "fake", Version: "1.0.0"})
	if cfg == nil {
		cfg = map[string]any{}
	}
	cfg["image_allowlist"] = []string{"python"}
	raw, err := json.Marshal(cfg)
	assert.NilError(t, err)
	assert.NilError(t, m.Configure(ctx, raw))
	t.Cleanup(func() { assert.NilError(t, m.Shutdown(ctx)) })
	return m, p
}

// TestPauseResume: pause keeps the sandbox (listed paused: true), refuses
// exec and fs with S005 naming sandbox::resume, is idempotent, and resume
// brings exec back; the capability is announced.
func TestPauseResume(t *testing.T) {
	m, p := newPausingManager(t, nil)
	info, err := m.Info(ctx)
	assert.NilError(t, err)
	assert.Check(t, info.HasCapability(contract.CapabilityPause))

	id := create(t, m, &contract.CreateRequest{})
	st, err := m.Pause(ctx, &contract.PauseRequest{SandboxID: id})
	assert.NilError(t, err)
	assert.DeepEqual(t, *st, contract.SandboxStatus{SandboxID: id, Status: contract.SandboxPaused})
	st, err = m.Pause(ctx, &contract.PauseRequest{SandboxID: id})
	assert.NilError(t, err)
	assert.Equal(t, st.Status, contract.SandboxPaused)
	assert.Equal(t, p.sandbox(id).pauses, 1, "a second pause reached the sandbox")

	_, err = m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo", "hi"}})
	assert.Equal(t, code(t, err), contract.S005)
	assert.Check(t, is.Contains(err.Error(), "sandbox::resume"))
	_, err = m.FsLs(ctx, &contract.FsLsRequest{SandboxID: id, Path: "/"})
	assert.Equal(t, code(t, err), contract.S005)
	l, err := m.List(ctx, &contract.ListRequest{})
	assert.NilError(t, err)
	assert.Equal(t, len(l.Sandboxes), 1)
	assert.Check(t, l.Sandboxes[0].Paused && !l.Sandboxes[0].Stopped)
	assert.Equal(t, l.Sandboxes[0].ExecSlotsFree, uint32(0))

	st, err = m.Resume(ctx, &contract.ResumeRequest{SandboxID: id})
	assert.NilError(t, err)
	assert.Equal(t, st.Status, contract.SandboxRunning)
	st, err = m.Resume(ctx, &contract.ResumeRequest{SandboxID: id})
	assert.NilError(t, err)
	assert.Equal(t, st.Status, contract.SandboxRunning)
	assert.Equal(t, p.sandbox(id).resumes, 1)
	out, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo", "back"}})
	assert.NilError(t, err)
	assert.Equal(t, out.Stdout, "back")

	// A paused sandbox can be stopped; then pause and resume say S004.
	_, err = m.Pause(ctx, &contract.PauseRequest{SandboxID: id})
	assert.NilError(t, err)
	_, err = m.Stop(ctx, &contract.StopRequest{SandboxID: id})
	assert.NilError(t, err)
	_, err = m.Resume(ctx, &contract.ResumeRequest{SandboxID: id})
	assert.Equal(t, code(t, err), contract.S004)
	_, err = m.Pause(ctx, &contract.PauseRequest{SandboxID: "0b7c3a52-4c0e-4b6a-9a43-5bd0c6d8a001"})
	assert.Equal(t, code(t, err), contract.S002)
}

// TestPauseRefusedWhileBusy: an exec in flight makes pause S003.
func TestPauseRefusedWhileBusy(t *testing.T) {
	m, _ := newPausingManager(t, nil)
	id := create(t, m, &contract.CreateRequest{})
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = m.Exec(bctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"block"}})
	}()
	waitInFlight(t, m, id, 1)
	_, err := m.Pause(ctx, &contract.PauseRequest{SandboxID: id})
	assert.Equal(t, code(t, err), contract.S003)
	cancel()
	<-done
}

// TestPauseUnsupported: a provider without PauseProvider does not announce
// the capability, answers S006, and idle_action: pause is refused.
func TestPauseUnsupported(t *testing.T) {
	m, _ := newManager(t, nil)
	info, err := m.Info(ctx)
	assert.NilError(t, err)
	assert.Check(t, !info.HasCapability(contract.CapabilityPause))
	id := create(t, m, &contract.CreateRequest{})
	_, err = m.Pause(ctx, &contract.PauseRequest{SandboxID: id})
	assert.Equal(t, code(t, err), contract.S006)
	_, err = m.Resume(ctx, &contract.ResumeRequest{SandboxID: id})
	assert.Equal(t, code(t, err), contract.S006)

	m2 := New(newFakeProvider(), Options{Name: "fake"})
	err = m2.Configure(ctx, []byte(`{"idle_action":"pause"}`))
	assert.ErrorContains(t, err, "cannot be paused")
	assert.NilError(t, m2.Shutdown(ctx))
	m3 := New(pausingProvider{newFakeProvider()}, Options{Name: "fake"})
	err = m3.Configure(ctx, []byte(`{"idle_action":"sleep"}`))
	assert.ErrorContains(t, err, "idle_action")
	assert.NilError(t, m3.Shutdown(ctx))
}

// TestReaperPauses: with idle_action: pause the reaper pauses an idle
// sandbox instead of stopping it, and leaves a paused one alone.
func TestReaperPauses(t *testing.T) {
	m, p := newPausingManager(t, map[string]any{"idle_action": "pause", "default_idle_timeout_secs": 60})
	start := time.Now()
	m.now = func() time.Time { return start }
	id := create(t, m, &contract.CreateRequest{})
	assert.DeepEqual(t, m.reapOnce(start.Add(61*time.Second)), []string{id})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		l, err := m.List(ctx, &contract.ListRequest{})
		if err != nil {
			return poll.Error(err)
		}
		if !l.Sandboxes[0].Paused {
			return poll.Continue("not paused yet")
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(time.Millisecond))
	assert.Equal(t, p.sandbox(id).stops(), 0)
	assert.DeepEqual(t, m.reapOnce(start.Add(time.Hour)), []string{})
	st, err := m.Resume(ctx, &contract.ResumeRequest{SandboxID: id})
	assert.NilError(t, err)
	assert.Equal(t, st.Status, contract.SandboxRunning)
}

// TestReaperStopsWhatCannotPause: with idle_action: pause, an idle sandbox
// whose pause fails is stopped, as without it.
func TestReaperStopsWhatCannotPause(t *testing.T) {
	m, p := newPausingManager(t, map[string]any{"idle_action": "pause", "default_idle_timeout_secs": 60})
	start := time.Now()
	m.now = func() time.Time { return start }
	id := create(t, m, &contract.CreateRequest{})
	sb := p.sandbox(id)
	sb.mu.Lock()
	sb.pauseErr = contract.NewError(contract.S006, "this back end cannot pause")
	sb.mu.Unlock()
	assert.DeepEqual(t, m.reapOnce(start.Add(61*time.Second)), []string{id})
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if sb.stops() != 1 {
			return poll.Continue("not stopped yet")
		}
		return poll.Success()
	}, poll.WithTimeout(30*time.Second), poll.WithDelay(time.Millisecond))
	_, err := m.Exec(ctx, &contract.ExecRequest{SandboxID: id, Argv: []string{"echo"}})
	assert.Equal(t, code(t, err), contract.S004)
	assert.Check(t, is.Contains(err.Error(), "pausing it failed"))
}

package sandboxkit

import (
	"sync"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
)

type events struct {
	mu  sync.Mutex
	evs []contract.ProgressEvent
}

func (e *events) sink(ev contract.ProgressEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

func (e *events) all() []contract.ProgressEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]contract.ProgressEvent(nil), e.evs...)
}

// The provider's progress reaches the caller with the image filled in, and
// the kit adds ready, naming the sandbox, once the boot succeeded.
func TestCreateReportsProgress(t *testing.T) {
	m, p := newManager(t, nil)
	p.progress = []contract.ProgressEvent{
		contract.ProgressEvent{Phase: contract.ProgressPulling}.WithBytes(1, 2),
		{Phase: contract.ProgressBooting, Image: "own-name", ImageRef: "own/ref"},
	}
	want := func(id string) []contract.ProgressEvent {
		return []contract.ProgressEvent{
			contract.ProgressEvent{Phase: contract.ProgressPulling, Image: "python", ImageRef: "example/python:1"}.WithBytes(1, 2),
			{Phase: contract.ProgressBooting, Image: "own-name", ImageRef: "own/ref"},
			{Phase: contract.ProgressReady, Image: "python", ImageRef: "example/python:1", SandboxID: id},
		}
	}

	t.Run("create", func(t *testing.T) {
		var got events
		out, err := m.Create(contract.WithProgress(ctx, got.sink), &contract.CreateRequest{Image: "python"})
		assert.NilError(t, err)
		assert.DeepEqual(t, got.all(), want(out.SandboxID))
	})
	t.Run("run", func(t *testing.T) {
		var got events
		out, err := m.Run(contract.WithProgress(ctx, got.sink), &contract.RunRequest{Image: "python", Lang: "py", Code: "x", KeepSandbox: true})
		assert.NilError(t, err)
		assert.DeepEqual(t, got.all(), want(out.SandboxID))
	})
	t.Run("without a sink", func(t *testing.T) {
		create(t, m, &contract.CreateRequest{})
	})
	t.Run("a failed boot is not ready", func(t *testing.T) {
		p.mu.Lock()
		p.bootErr = contract.NewError(contract.S102, "the registry hung up")
		p.mu.Unlock()
		var got events
		_, err := m.Create(contract.WithProgress(ctx, got.sink), &contract.CreateRequest{Image: "python"})
		assert.Equal(t, code(t, err), contract.S102)
		assert.DeepEqual(t, got.all(), want("")[:2])
	})
}

// The reaper asks every sandbox for its activity at once: here each
// sandbox's LastActivity waits until the other one is being asked too,
// which only concurrent reads get past.
func TestReaperReadsActivityConcurrently(t *testing.T) {
	m, p := newManager(t, nil)
	var mu sync.Mutex
	asked := 0
	both := make(chan struct{})
	var failures []string
	p.activityHook = func() {
		mu.Lock()
		asked++
		if asked == 2 {
			close(both)
		}
		mu.Unlock()
		guard := time.NewTimer(30 * time.Second) // a hang guard, not a timing check
		defer guard.Stop()
		select {
		case <-both:
		case <-guard.C:
			mu.Lock()
			failures = append(failures, "a sandbox answered alone: the reads were not concurrent")
			mu.Unlock()
		}
	}
	create(t, m, &contract.CreateRequest{})
	create(t, m, &contract.CreateRequest{})
	assert.DeepEqual(t, m.reapOnce(time.Now()), []string{})
	mu.Lock()
	defer mu.Unlock()
	assert.Check(t, is.Len(failures, 0), "%v", failures)
	assert.Equal(t, asked, 2)
}

// Boot learns the reaper's tick, so a provider can pace its activity
// sampling.
func TestBootSpecReaperTick(t *testing.T) {
	m, p := newManager(t, map[string]any{"reaper_tick_ms": 250})
	create(t, m, &contract.CreateRequest{})
	p.mu.Lock()
	defer p.mu.Unlock()
	assert.Equal(t, p.boots[0].ReaperTick, 250*time.Millisecond)
}

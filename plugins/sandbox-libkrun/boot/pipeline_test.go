package boot

import (
	"context"
	"errors"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
)

func TestDefaultBootSteps(t *testing.T) {
	assert.DeepEqual(t, DefaultBootSteps().Names(), []string{
		"select-backend", "resolve-image", "build-initramfs", "find-template", "prepare-state-dir",
		"spawn-runner", "connect-agent", "configure-guest",
	})
}

func TestBootStepsEdit(t *testing.T) {
	base := DefaultBootSteps()
	noop := func(context.Context, *Boot) error { return nil }

	removed, err := base.Remove(StepBuildInitramfs)
	assert.NilError(t, err)
	assert.Check(t, !contains(removed.Names(), StepBuildInitramfs))
	assert.Equal(t, len(base), 8, "Remove must not change the original")

	before, err := base.InsertBefore(StepSpawnRunner, BootStep{"check", noop})
	assert.NilError(t, err)
	assert.DeepEqual(t, before.Names()[4:7], []string{"prepare-state-dir", "check", "spawn-runner"})
	after, err := base.InsertAfter(StepConfigureGuest, BootStep{"last", noop})
	assert.NilError(t, err)
	assert.Equal(t, after.Names()[8], "last")
	replaced, err := base.Replace(StepConnectAgent, noop)
	assert.NilError(t, err)
	assert.DeepEqual(t, replaced.Names(), base.Names())

	for _, f := range []func() (BootSteps, error){
		func() (BootSteps, error) { return base.Remove("nope") },
		func() (BootSteps, error) { return base.Replace("nope", noop) },
		func() (BootSteps, error) { return base.InsertBefore("nope", BootStep{"x", noop}) },
		func() (BootSteps, error) { return base.InsertAfter("nope", BootStep{"x", noop}) },
	} {
		_, err := f()
		assert.ErrorContains(t, err, `no boot step "nope"`)
	}
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// recorder builds steps that log what ran and what was undone.
type recorder struct{ log []string }

func (r *recorder) step(name string, err error) BootStep {
	return BootStep{name, func(_ context.Context, b *Boot) error {
		r.log = append(r.log, "run "+name)
		if err != nil {
			return err
		}
		b.OnFailure(func() { r.log = append(r.log, "undo "+name) })
		return nil
	}}
}

func TestBootStepsRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail error
		code contract.Code
		msg  string
	}{
		{"an S-code keeps its code", contract.NewError(contract.S101, "image missing"), contract.S101, "image missing"},
		{"anything else is S300 naming the step", errors.New("disk full"), contract.S300, "sandbox boot step c failed: disk full"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			steps := BootSteps{r.step("a", nil), r.step("b", nil), r.step("c", tc.fail), r.step("d", nil)}
			b := &Boot{}
			err := steps.Run(context.Background(), b)
			assert.Assert(t, contract.IsCode(err, tc.code), "%v", err)
			assert.ErrorContains(t, err, tc.msg)
			assert.DeepEqual(t, r.log, []string{"run a", "run b", "run c", "undo b", "undo a"})
			assert.Check(t, is.Len(b.Timings, 3))
		})
	}
	t.Run("success keeps the work", func(t *testing.T) {
		r := &recorder{}
		b := &Boot{}
		assert.NilError(t, BootSteps{r.step("a", nil), r.step("b", nil)}.Run(context.Background(), b))
		assert.DeepEqual(t, r.log, []string{"run a", "run b"})
		assert.DeepEqual(t, []string{b.Timings[0].Step, b.Timings[1].Step}, []string{"a", "b"})
	})
	t.Run("a canceled context stops the pipeline and stays itself", func(t *testing.T) {
		r := &recorder{}
		ctx, cancel := context.WithCancel(context.Background())
		cancelling := BootStep{"cancel", func(context.Context, *Boot) error { cancel(); return nil }}
		err := BootSteps{r.step("a", nil), cancelling, r.step("b", nil)}.Run(ctx, &Boot{})
		assert.Assert(t, errors.Is(err, context.Canceled), "%v", err)
		assert.DeepEqual(t, r.log, []string{"run a", "undo a"})
	})
}

// An image install's reports become the contract's progress phases: the
// tag lookup is the start of the pull, an unknown total is left out.
func TestImageProgress(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   images.Progress
		want contract.ProgressEvent
	}{
		{"resolving", images.Progress{Phase: images.PhaseResolving, Total: -1},
			contract.ProgressEvent{Phase: contract.ProgressPulling}},
		{"pulling", images.Progress{Phase: images.PhasePulling, Done: 5, Total: 10},
			contract.ProgressEvent{Phase: contract.ProgressPulling}.WithBytes(5, 10)},
		{"pulling of an unknown total", images.Progress{Phase: images.PhasePulling, Done: 5, Total: -1},
			contract.ProgressEvent{Phase: contract.ProgressPulling}.WithBytes(5, 0)},
		{"unpacking", images.Progress{Phase: images.PhaseUnpacking, Done: 0, Total: 10},
			contract.ProgressEvent{Phase: contract.ProgressUnpacking}.WithBytes(0, 10)},
		{"building", images.Progress{Phase: images.PhaseBuilding, Done: 7, Total: 7},
			contract.ProgressEvent{Phase: contract.ProgressBuilding}.WithBytes(7, 7)},
		{"a negative count is no count", images.Progress{Phase: images.PhaseBuilding, Done: -1, Total: 7},
			contract.ProgressEvent{Phase: contract.ProgressBuilding}},
		{"a phase of a newer store passes through", images.Progress{Phase: "verifying", Done: 1, Total: 2},
			contract.ProgressEvent{Phase: "verifying"}.WithBytes(1, 2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.DeepEqual(t, imageProgress(tc.in), tc.want)
		})
	}
}
func TestMergeEnv(t *testing.T) {
	assert.DeepEqual(t, MergeEnv(
		[]string{"HOME=/root"},
		[]string{"PATH=/bin", "LANG=C", "bad", "=x"},
		[]string{"LANG=C.UTF-8", "X=1", "HOME=/w"},
	), []string{"HOME=/w", "PATH=/bin", "LANG=C.UTF-8", "X=1"})
	assert.Check(t, is.Len(MergeEnv(), 0))
}

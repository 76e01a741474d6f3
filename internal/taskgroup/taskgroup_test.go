package taskgroup

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWaitSeesEveryTaskEnd(t *testing.T) {
	var g Group
	assert.NilError(t, g.Wait(context.Background()), "an empty group waits for nothing")
	release := make(chan struct{})
	for range 2 {
		assert.Assert(t, g.Add())
		go func() {
			defer g.Done()
			<-release
		}()
	}
	assert.Assert(t, g.Go(func() { <-release }))
	g.Close()
	assert.Assert(t, !g.Add(), "a closed group refuses new tasks")
	assert.Assert(t, !g.Go(func() { t.Error("a refused task ran") }))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.Assert(t, errors.Is(g.Wait(ctx), context.DeadlineExceeded), "tasks still run")

	close(release)
	assert.NilError(t, g.Wait(context.Background()))
}

// Waiting before Close works too, and the group can be waited on again.
func TestWaitBeforeClose(t *testing.T) {
	var g Group
	assert.Assert(t, g.Add())
	done := make(chan error, 1)
	go func() { done <- g.Wait(context.Background()) }()
	time.Sleep(5 * time.Millisecond)
	g.Done()
	assert.NilError(t, <-done)
	assert.Assert(t, g.Add())
	g.Done()
	assert.NilError(t, g.Wait(context.Background()))
}

func TestDoneWithoutAddPanics(t *testing.T) {
	var g Group
	defer func() { assert.Assert(t, recover() != nil) }()
	g.Done()
}

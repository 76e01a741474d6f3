package taskgroup

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
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
	assert.NilError(t, g.Wait(bounded(t)), "waiting for the released tasks")
}

// bounded is a context for a Wait that must return promptly: a hang fails
// the test instead of stalling the package.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Default)
	t.Cleanup(cancel)
	return ctx
}

// Waiting before Close works too, and the group can be waited on again.
func TestWaitBeforeClose(t *testing.T) {
	var g Group
	assert.Assert(t, g.Add())
	done := make(chan error, 1)
	go func() { done <- g.Wait(bounded(t)) }()
	// The waiter is parked once it has made the channel Done closes.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.zero == nil {
			return poll.Continue("Wait has not started waiting")
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(time.Millisecond))
	select {
	case err := <-done:
		t.Fatalf("Wait returned (%v) while a task was counted", err)
	default:
	}
	g.Done()
	assert.NilError(t, waitfor.Recv(t, done, waitfor.Default, "Wait to return after the last Done"))
	assert.Assert(t, g.Add())
	g.Done()
	assert.NilError(t, g.Wait(bounded(t)))
}

func TestDoneWithoutAddPanics(t *testing.T) {
	var g Group
	defer func() { assert.Assert(t, recover() != nil) }()
	g.Done()
}

package images

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/internal/testkit/waitfor"
)

// TestFlightOneWaiterLeaves: a waiter that gives up does not cancel the
// install for the others; when the last one leaves, the install is
// cancelled.
func TestFlightOneWaiterLeaves(t *testing.T) {
	var f flights
	var calls atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	fn := func(ctx context.Context, report func(Progress)) (*Image, error) {
		calls.Add(1)
		close(started)
		report(Progress{Phase: PhasePulling, Done: 1, Total: 2})
		select {
		case <-release:
			return &Image{Digest: "sha256:x"}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}

	impatient, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := f.do(impatient, "k", nil, fn)
		errc <- err
	}()
	waitfor.Closed(t, started, waitfor.Default, "the work to start")
	patient := make(chan *Image, 1)
	go func() {
		img, err := f.do(context.Background(), "k", nil, fn)
		assert.Check(t, err)
		patient <- img
	}()
	// Wait until the second caller has joined the flight.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := 0
		if fl := f.m["k"]; fl != nil {
			n = fl.waiters
		}
		if n != 2 {
			return poll.Continue("%d waiters on the flight", n)
		}
		return poll.Success()
	}, poll.WithTimeout(waitfor.Default), poll.WithDelay(time.Millisecond))
	cancel()
	assert.Assert(t, errors.Is(waitfor.Recv(t, errc, waitfor.Default, "the impatient caller to leave"), context.Canceled))
	close(release)
	img := waitfor.Recv(t, patient, waitfor.Default, "the patient caller's image")
	assert.Equal(t, img.Digest, "sha256:x")
	assert.Equal(t, calls.Load(), int32(1))
	waitfor.Func(t, waitfor.Default, "the flights to end", f.wait)

	// Last waiter leaving cancels the work.
	cctx, ccancel := context.WithCancel(context.Background())
	workErr := make(chan error, 1)
	enter := make(chan struct{})
	go func() {
		_, err := f.do(cctx, "k2", nil, func(ctx context.Context, _ func(Progress)) (*Image, error) {
			close(enter)
			<-ctx.Done()
			workErr <- ctx.Err()
			return nil, ctx.Err()
		})
		assert.Check(t, errors.Is(err, context.Canceled))
	}()
	waitfor.Closed(t, enter, waitfor.Default, "the work to start")
	ccancel()
	assert.Assert(t, errors.Is(waitfor.Recv(t, workErr, waitfor.Default, "the work to be cancelled with its last waiter"), context.Canceled))
	waitfor.Func(t, waitfor.Default, "the flights to end", f.wait)
}

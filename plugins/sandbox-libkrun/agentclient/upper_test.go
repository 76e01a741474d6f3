//go:build linux

package agentclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
)

// TestFreezeUpperOlderAgent: an agent whose exec does not serve the
// built-ins (one older than them) finds no such program; FreezeUpper says
// so with ErrNoFreeze, the host's cue to keep no copy, and ThawUpper alike.
func TestFreezeUpperOlderAgent(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	assert.ErrorIs(t, c.FreezeUpper(ctx, time.Second), ErrNoFreeze)
	assert.ErrorIs(t, c.ThawUpper(ctx), ErrNoFreeze)
}

// TestExecRefusesBuiltins: a caller's exec (sandbox::exec reaches the
// agent through Exec) cannot name the agent's own operations, so no
// caller freezes a worker's disk; FreezeUpper still reaches the agent.
func TestExecRefusesBuiltins(t *testing.T) {
	env := startAgent(t)
	c := env.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, argv0 := range []string{agentproto.ExecFreezeUpper, agentproto.ExecThawUpper, agentproto.BuiltinPrefix + "anything"} {
		_, err := c.Exec(ctx, ExecRequest{Argv: []string{argv0, "1"}})
		var ce *contract.Error
		assert.Assert(t, errors.As(err, &ce), "%s: %v", argv0, err)
		assert.Equal(t, ce.Code, contract.S001)
		assert.ErrorContains(t, err, "names an operation of the guest agent")
	}
	// The host's own call is not refused (this agent predates the
	// built-ins, so it answers not found).
	assert.ErrorIs(t, c.FreezeUpper(ctx, time.Second), ErrNoFreeze)
}

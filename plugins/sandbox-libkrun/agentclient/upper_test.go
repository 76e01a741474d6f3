//go:build linux

package agentclient

import (
	"context"
	"testing"
	"time"

	"gotest.tools/v3/assert"
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

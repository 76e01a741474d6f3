package adapter

import (
	"context"
	"runtime"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
)

// configured returns a provider configured with keys, its state and cache
// under a short temporary home.
func configured(t *testing.T, exe string, keys map[string]any) *Provider {
	t.Helper()
	p := newTestProvider(t, Options{Executable: exe})
	assert.NilError(t, p.Configure(context.Background(), rawKeys(t, keys)))
	return p
}

// TestExplicitAccelSkipsTheProbe: with accel set, QEMU is used with it
// as is (no probe), and libkrun is not tried for an accelerator it cannot
// use.
func TestExplicitAccelSkipsTheProbe(t *testing.T) {
	exe := needVMs(t)
	p := configured(t, exe, map[string]any{"accel": "tcg"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := p.selected(ctx)
	assert.NilError(t, err)
	assert.Equal(t, s.Backend, backend.QEMU)
	assert.Equal(t, s.Accel, backend.AccelTCG)
	assert.Check(t, is.Len(s.Probe, 0))
	assert.Check(t, is.Len(s.Skipped, 0))
	assert.Equal(t, s.Agent, exe[:len(exe)-len("sandbox-libkrun")]+AgentName(runtime.GOARCH))
}

// TestProbeViaRunner boots the bare initramfs through a real runner and
// the QEMU back end, the way libkrun is probed: the agent answers, and the
// probe leaves nothing in state_dir.
func TestProbeViaRunner(t *testing.T) {
	exe := needVMs(t)
	p := configured(t, exe, map[string]any{"accel": "tcg"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := p.selected(ctx)
	assert.NilError(t, err)
	assert.NilError(t, boot.ProbeViaRunner(ctx, p.host(), s, time.Minute))
	assert.Check(t, is.Len(dirs.Names(t, p.cfg.StateDir), 0))

	// A probe that cannot answer in time fails, and cleans up too.
	err = boot.ProbeViaRunner(ctx, p.host(), s, time.Millisecond)
	assert.ErrorContains(t, err, "no hello from the guest agent in time")
	assert.Check(t, is.Len(dirs.Names(t, p.cfg.StateDir), 0))
}

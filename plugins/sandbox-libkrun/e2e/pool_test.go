package e2e

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
)

// poolReady is adapter::info's warm_pool ready count for image.
func poolReady(t *testing.T, p *proc, image string) (ready, target float64) {
	t.Helper()
	wp, _ := p.info(t)["warm_pool"].(map[string]any)
	e, _ := wp[image].(map[string]any)
	ready, _ = e["ready"].(float64)
	target, _ = e["target"].(float64)
	return ready, target
}

func waitPoolReady(t *testing.T, p *proc, image string, n float64) {
	t.Helper()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if r, _ := poolReady(t, p, image); r != n {
			return poll.Continue("warm pool %s ready %v, want %v", image, r, n)
		}
		return poll.Success()
	}, poll.WithTimeout(3*time.Minute), poll.WithDelay(100*time.Millisecond))
}

// claimed reports whether sandbox id was served from the warm pool: the
// adapter's "sandbox VM ready" line for it names the pooled VM. The log
// arrives asynchronously, so it waits for that line.
func claimed(t *testing.T, p *proc, id string) bool {
	t.Helper()
	line := readyLine(t, p, id)
	return strings.Contains(line, `"pooled":"`) && !strings.Contains(line, `"pooled":""`)
}

// TestWarmPool: a create in the default shape claims the pooled VM (not
// listed, not counted while pooled), any other shape boots cold, the pool
// refills, a later pooled sandbox never sees an earlier one's files, and
// stopping the adapter leaves no pooled VM, runner or QEMU.
func TestWarmPool(t *testing.T) {
	t.Parallel()
	e := needVMs(t)
	p := start(t, e, dirs.Short(t, "sb"), map[string]any{
		"warm_pool":                map[string]any{"python": 1},
		"max_concurrent_sandboxes": 1,
	})
	waitPoolReady(t, p, "python", 1)
	_, target := poolReady(t, p, "python")
	assert.Equal(t, target, float64(1))

	// Pooled VMs are not sandboxes.
	var list contract.ListResponse
	p.call(t, contract.OpList, nil, &list)
	assert.Check(t, is.Len(list.Sandboxes, 0))

	// A matching create claims it, with the request's env and name.
	a := p.create(t, map[string]any{"env": []string{"E2E=pooled"}, "name": "first"})
	assert.Assert(t, claimed(t, p, a), "the create did not claim the pooled VM")
	// The claim fed the guest's RNG and set its clock.
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		for _, l := range strings.Split(p.logs.String(), "\n") {
			if strings.Contains(l, `"warm pool VM claimed"`) && strings.Contains(l, a) && strings.Contains(l, `"reseeded":true`) {
				return poll.Success()
			}
		}
		return poll.Continue("no reseeded claim logged for %s", a)
	}, poll.WithTimeout(10*time.Second), poll.WithDelay(20*time.Millisecond))
	assert.Equal(t, p.sh(t, a, "echo $E2E"), "pooled\n")
	p.call(t, contract.OpList, nil, &list)
	assert.Assert(t, is.Len(list.Sandboxes, 1))
	assert.Check(t, is.Equal(list.Sandboxes[0].SandboxID, a))
	assert.Check(t, is.Equal(list.Sandboxes[0].Name, "first"))
	p.sh(t, a, "echo secret > /etc/pool-marker && echo secret > /root/pool-marker")

	// The refill (a pooled VM in the background) does not count against
	// max_concurrent_sandboxes: one sandbox is live, the limit is 1.
	waitPoolReady(t, p, "python", 1)
	p.fail(t, contract.OpCreate, map[string]any{"image": "python"}, contract.S400)
	p.stop(t, a)

	// Another shape boots cold and leaves the pool alone.
	b := p.create(t, map[string]any{"memory_mb": 640})
	assert.Check(t, !claimed(t, p, b), "a 640 MiB create was served from the pool")
	r, _ := poolReady(t, p, "python")
	assert.Check(t, is.Equal(r, float64(1)))
	p.stop(t, b)

	// The refilled VM is a fresh one: the first sandbox's files are not
	// in it.
	c := p.create(t, nil)
	assert.Assert(t, claimed(t, p, c))
	assert.Equal(t, p.sh(t, c, "ls /etc/pool-marker /root/pool-marker 2>/dev/null; true"), "")
	p.stop(t, c)

	// Stopping the adapter stops the pooled VM (refilled meanwhile, or
	// booting) too.
	waitPoolReady(t, p, "python", 1)
	p.client.Kill()
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		left, names := procsUnder(p.stateDir), sandboxDirs(t, p.stateDir)
		if len(left) > 0 || len(names) > 0 {
			return poll.Continue("processes %v, directories %v", left, names)
		}
		return poll.Success()
	}, poll.WithTimeout(5*time.Second), poll.WithDelay(20*time.Millisecond))
}

// TestWarmPoolRejected: a warm_pool that cannot work is refused at start.
func TestWarmPoolRejected(t *testing.T) {
	e := needVMs(t)
	for name, bad := range map[string]any{
		"unknown image":     map[string]any{"ruby": 1},
		"not allowlisted":   map[string]any{"node": 1},
		"negative":          map[string]any{"python": -1},
		"absurd":            map[string]any{"python": 100000},
		"not a map":         []any{"python"},
		"count not integer": map[string]any{"python": 1.5},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := startErr(t, e, dirs.Short(t, "sb"), map[string]any{"warm_pool": bad})
			assert.ErrorContains(t, err, "warm_pool")
		})
	}
}

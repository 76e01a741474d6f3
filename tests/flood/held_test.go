package flood

import (
	"context"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/flood"
)

// TestHeldFloods: what a caller can make the engine hold — calls it never
// answers (1 MB ids, count, payload bytes), enqueues of 1 MiB waiting on a
// queue provider that does not answer, registrations with 1 MB
// descriptions, schemas and configs, 60 MiB partial frames on /otel and
// channel writers, re-joins on the stream socket by a client that does not
// read — is bounded and charged to that caller, as an anonymous worker and
// with a VM worker's credential. Each offender gets its LIMIT_EXCEEDED
// (error frame, call answer or close reason) or is dropped; the engine's
// peak RSS during each flood stays under the documented bound; the
// well-behaved worker's calls all succeed.
func TestHeldFloods(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a real engine with hundreds of MiB for minutes; skipped with -short")
	}
	t.Parallel()
	// Each caller floods an engine of its own, both at once: the floods
	// mostly wait on the engine's timers (the slow-consumer time, a
	// client that does not read), so two engines take the time of one,
	// and each phase's peak RSS is still one engine's.
	callers := map[string]func(context.Context, *flood.Engine) (flood.Caller, error){
		"anonymous": func(context.Context, *flood.Engine) (flood.Caller, error) { return flood.Anonymous, nil },
		"vm-credential": func(ctx context.Context, e *flood.Engine) (flood.Caller, error) {
			return flood.IssueVMCredential(ctx, e, "proj")
		},
	}
	for name, caller := range callers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			heldFloods(t, caller)
		})
	}
}

func heldFloods(t *testing.T, caller func(context.Context, *flood.Engine) (flood.Caller, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	e, err := flood.StartWith(ctx, testBins.Path(t, "iii"), t.TempDir(), true)
	assert.NilError(t, err)
	t.Cleanup(func() {
		e.Stop()
		if t.Failed() {
			t.Logf("engine log (tail):\n%s", e.Logs(6000))
		}
	})
	as, err := caller(ctx, e)
	assert.NilError(t, err)
	p, err := flood.StartProber(ctx, e.URL)
	assert.NilError(t, err)
	defer p.Close()

	phases, err := flood.RunHeld(ctx, e, p, []flood.Caller{as}, func(ph flood.Phase) {
		t.Logf("%s done: %s (violation: %q) p99 %v, peak RSS %d MiB", ph.Name, ph.Offender, ph.Violation, ph.P99, ph.PeakRSS)
	})
	assert.NilError(t, err)
	for _, ph := range phases {
		t.Logf("%s: %s; well-behaved worker: %d calls, p50 %v, p99 %v; engine peak RSS %d MiB",
			ph.Name, ph.Offender, ph.Calls, ph.P50, ph.P99, ph.PeakRSS)
		assert.Check(t, ph.Violation == "", "%s: %s", ph.Name, ph.Violation)
		assert.Check(t, len(ph.Failures) == 0, "%s: the well-behaved worker's calls failed: %v", ph.Name, ph.Failures)
		assert.Check(t, ph.Calls > 0, "%s: no call of the well-behaved worker completed", ph.Name)
		assert.Check(t, ph.PeakRSS < RSSBoundMiB, "%s: engine peak RSS %d MiB is over the documented %d MiB", ph.Name, ph.PeakRSS, RSSBoundMiB)
	}
}

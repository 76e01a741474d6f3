// Package flood attacks a real engine process (bin/iii with a config.yaml)
// the way a hostile worker would (internal/testkit/flood). Throughout, a
// well-behaved worker's calls must keep succeeding, each offender must get
// its error, and the engine's peak RSS must stay under the bound
// docs/security.md documents.
package flood

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/flood"
)

// RSSBoundMiB is the engine's documented peak resident memory under these
// floods (docs/security.md, "Limits"): its own baseline plus the two
// large-frame lanes (two frames of up to 64 MiB, each read in pieces and
// joined: 256 MiB) plus one channel's buffer and the sockets.
const RSSBoundMiB = 512

var testBins *bins.Set

func TestMain(m *testing.M) {
	var err error
	testBins, err = bins.New("iii-flood-", map[string]string{"iii": "github.com/iii-sandbox/iii/cmd/iii"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(testBins.Main(m))
}

func TestFloods(t *testing.T) {
	if testing.Short() {
		t.Skip("floods a real engine with hundreds of MiB; skipped with -short")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e, err := flood.Start(ctx, testBins.Path(t, "iii"), t.TempDir())
	assert.NilError(t, err)
	t.Cleanup(func() {
		e.Stop()
		if t.Failed() {
			t.Logf("engine log (tail):\n%s", e.Logs(4000))
		}
	})
	p, err := flood.StartProber(ctx, e.URL)
	assert.NilError(t, err)
	defer p.Close()

	phases, err := flood.Run(ctx, e, p)
	assert.NilError(t, err)
	for _, ph := range phases {
		t.Logf("%s: %s; well-behaved worker: %d calls, p50 %v, p99 %v; engine peak RSS so far %d MiB",
			ph.Name, ph.Offender, ph.Calls, ph.P50, ph.P99, ph.PeakRSS)
		assert.Check(t, ph.Violation == "", "%s: %s", ph.Name, ph.Violation)
		assert.Check(t, len(ph.Failures) == 0, "%s: the well-behaved worker's calls failed: %v", ph.Name, ph.Failures)
		assert.Check(t, ph.Calls > 0, "%s: no call of the well-behaved worker completed", ph.Name)
	}
	rss, err := e.PeakRSSMiB()
	assert.NilError(t, err)
	assert.Assert(t, rss < RSSBoundMiB, "engine peak RSS %d MiB is over the documented %d MiB", rss, RSSBoundMiB)
}

//go:build linux

package agentclient

import (
	"context"
	"testing"
	"time"
)

// BenchmarkExecTrue is P6 without the VM: the real agent server and
// executor on this host, a real Client over a socket pair, `true` run
// round trip. It reports the agent's own fork+exec+wait figure beside
// the round trip, so the agent's and client's work around the fork shows
// as their difference (guest-us/op vs ns/op); run with -cpuprofile to see
// where it goes.
func BenchmarkExecTrue(b *testing.B) {
	env := startAgent(b)
	c := env.connect(b)
	ctx := context.Background()
	truePath := "/bin/true"
	var inGuest time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := c.Exec(ctx, ExecRequest{Argv: []string{truePath}})
		if err != nil {
			b.Fatal(err)
		}
		if res.ExitCode != 0 {
			b.Fatalf("true exited %d", res.ExitCode)
		}
		inGuest += res.Duration
	}
	b.ReportMetric(float64(inGuest.Microseconds())/float64(b.N), "guest-us/op")
}

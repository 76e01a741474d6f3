package enginebench

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gotest.tools/v3/assert"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every measured path really carries calls, so a figure never comes from a
// broken setup.
func TestPathsCarryCalls(t *testing.T) {
	for _, kind := range []Kind{Echo, Relay, Engine} {
		t.Run(string(kind), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s, err := Start(ctx, Options{Kind: kind, Conns: 2, Payload: []byte(`{"k":"v"}`)})
			assert.NilError(t, err)
			defer s.Close()
			d, err := Latency(ctx, s, 5, 20)
			assert.NilError(t, err)
			assert.Equal(t, len(d), 20)
			assert.Assert(t, Percentile(d, 50) <= Percentile(d, 99))
			rate, err := Throughput(ctx, s, 8, 50*time.Millisecond)
			assert.NilError(t, err)
			assert.Assert(t, rate > 0)
		})
	}
}

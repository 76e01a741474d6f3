package config

import (
	"testing"

	"gotest.tools/v3/assert"
)

// TestListenerHeldLimits: the caps on what a caller can make the engine
// hold are read from limits: like the others.
func TestListenerHeldLimits(t *testing.T) {
	src := `workers:
  - name: iii-worker-manager
    config:
      limits: { id_bytes: 256, inflight_per_connection: 100, inflight_bytes_per_connection: 1048576,
                registration_bytes: 65536, registration_bytes_per_connection: 4194304 }
`
	cfg, err := parse(t, src, nil)
	assert.NilError(t, err)
	assert.Equal(t, cfg.Listeners[0].Limits, ListenerLimits{IDBytes: 256, InflightPerConnection: 100, InflightBytesPerConnection: 1 << 20,
		RegistrationBytes: 64 << 10, RegistrationBytesPerConnection: 4 << 20})
}

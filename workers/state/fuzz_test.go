package state

import (
	"encoding/json"
	"testing"
)

// FuzzParseConfig: any configuration value is parsed or refused, never a
// panic, and what parses resolves to a store or an error.
func FuzzParseConfig(f *testing.F) {
	f.Add(DefaultConfig)
	f.Add(`{"adapter":{"name":"redis","config":{"redis_url":"redis://x"}},"save_interval_ms":100}`)
	f.Add(`{"adapter":{"name":"kv","config":null},"max_value_bytes":-1}`)
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := ParseConfig(json.RawMessage(raw))
		if err != nil {
			return
		}
		_, _ = c.Store("/base")
	})
}

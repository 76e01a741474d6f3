package pubsub

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/iii-sandbox/iii/client"
)

// FuzzInputs: any configuration, publish payload or subscribe config is
// taken or refused with an error, never a panic; a refused publish
// delivers nothing.
func FuzzInputs(f *testing.F) {
	for _, s := range []string{DefaultConfig, `{"adapter":{"name":"redis","config":{"redis_url":"redis://x"}}}`, `null`, ``, ` `, `{"topic":"a","data":1}`,
		`{"topic":""}`, `[`, `"x"`, `{"topic":{"a":1}}`, `{"adapter":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _, _ = ParseConfig(raw)
		rec := &recorder{}
		hub := NewHub(rec, nil)
		svc := NewService(hub, LocalBroker{Hub: hub}, nil)
		_ = svc.RegisterTrigger(context.Background(), client.TriggerRegistration{ID: "t", FunctionID: "f", Config: raw})
		_ = svc.RegisterTrigger(context.Background(), client.TriggerRegistration{ID: "u", FunctionID: "g", Config: json.RawMessage(`{"topic":"a"}`)})
		if _, err := svc.Publish(context.Background(), raw); err != nil && len(rec.got()) != 0 {
			t.Fatalf("a refused publish %q delivered %v", raw, rec.got())
		}
	})
}

package workerkit

import (
	"encoding/json"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// FuzzConfigFile: any III_CONFIG content is converted and expanded to JSON
// or refused, never a panic.
func FuzzConfigFile(f *testing.F) {
	f.Add("a: 1\nb: [x, '${V:2}']\n")
	f.Add(`{"adapter":{"name":"kv","config":{"file_path":"${DIR}/x"}}}`)
	f.Add("&a [*a]")
	f.Add("? [1]\n: x\n")
	k := &Kit{Log: hclog.NewNullLogger(), getenv: func(string) string { return "v" }}
	f.Fuzz(func(t *testing.T, doc string) {
		j, err := YAMLToJSON([]byte(doc))
		if err != nil {
			return
		}
		out, err := k.expand(j)
		if err != nil {
			t.Fatalf("converted %q to %s, which does not expand: %v", doc, j, err)
		}
		if !json.Valid(out) {
			t.Fatalf("not JSON: %s", out)
		}
	})
}

package composefile

import (
	_ "embed"
	"encoding/json"
)

//go:embed schema.json
var schemaJSON []byte

//go:embed example.yaml
var exampleYAML string

// Schema returns the JSON Schema (draft 2020-12) of worker-compose.yaml as
// written (references unexpanded). It accepts every file Load accepts and
// refuses the structural mistakes Load refuses (unknown keys, wrong types,
// bad names, missing worker or version); checks that need the environment,
// the file system or the whole graph (variables, env files, cycles, the
// engine port) are Load's alone. compose::schema serves it under the
// pseudo-id worker-compose.yaml.
func Schema() json.RawMessage {
	return append(json.RawMessage(nil), schemaJSON...)
}

// Example returns a commented example worker-compose.yaml that Load
// accepts.
func Example() string { return exampleYAML }

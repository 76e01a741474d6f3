package composefile

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"
)

// TestValidCorpus loads every testdata/valid/*.yaml (the YAML blocks of
// the 0.26 upgrade guide and spec §5.12 among them): each must load, the
// JSON Schema must accept it, and the resulting model must equal its
// .golden dump (-update rewrites them).
func TestValidCorpus(t *testing.T) {
	schema := compileSchema(t)
	files, err := filepath.Glob("testdata/valid/*.yaml")
	assert.NilError(t, err)
	assert.Assert(t, len(files) >= 10)
	abs, err := filepath.Abs("testdata/valid")
	assert.NilError(t, err)
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		t.Run(name, func(t *testing.T) {
			f, err := Load(file, testEnv)
			assert.NilError(t, err)
			data, err := os.ReadFile(file)
			assert.NilError(t, err)
			assert.NilError(t, schema.Validate(yamlValue(t, data)))
			dump, err := json.MarshalIndent(f, "", "  ")
			assert.NilError(t, err)
			golden.Assert(t, strings.ReplaceAll(string(dump), abs, "<dir>")+"\n", "valid/"+name+".golden")
		})
	}
}

func TestExampleIsValid(t *testing.T) {
	f, err := Parse([]byte(Example()), filepath.Join(t.TempDir(), FileName), nil)
	assert.NilError(t, err)
	assert.Equal(t, f.Namespace, "shop")
	assert.Assert(t, f.Engine != nil && !f.Engine.Empty)
	assert.DeepEqual(t, f.Order, []string{"sandbox-libkrun", "database", "api"})
	// config_override is kept literal even though API_KEY is unset.
	assert.Equal(t, f.Containers["api"].ConfigOverride["api_key"], "${API_KEY}")
	assert.NilError(t, compileSchema(t).Validate(yamlValue(t, []byte(Example()))))
}

func TestSchemaIsDraft2020(t *testing.T) {
	var doc map[string]any
	assert.NilError(t, json.Unmarshal(Schema(), &doc))
	assert.Equal(t, doc["$schema"], "https://json-schema.org/draft/2020-12/schema")
	// Schema returns a copy: a caller cannot change what the next one gets.
	s := Schema()
	s[0] = 'x'
	assert.Equal(t, Schema()[0], byte('{'))
}

package composefile

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gotest.tools/v3/assert"
	"gotest.tools/v3/golden"

	"github.com/iii-sandbox/iii/compose"
)

// testEnv is Compose's environment in the corpus tests.
func testEnv(name string) (string, bool) {
	v, ok := map[string]string{"SET": "value", "EMPTY": ""}[name]
	return v, ok
}

// headerRE reads the first line of an error case: the code Load must
// return and what the JSON Schema must say about the file (reject: a
// structural error the schema sees too; accept: an error only Load can
// see; skip: the file is not a YAML document the schema can judge, such as
// duplicate keys or broken YAML).
var headerRE = regexp.MustCompile(`^# code: ([A-Z_]+) schema: (reject|accept|skip)\n`)

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(Schema()))
	assert.NilError(t, err)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	assert.NilError(t, c.AddResource("worker-compose.yaml", doc))
	s, err := c.Compile("worker-compose.yaml")
	assert.NilError(t, err)
	return s
}

// yamlValue reads a compose file the way a schema-aware editor would: the
// YAML as written, references unexpanded, as plain JSON-like values.
func yamlValue(t *testing.T, data []byte) any {
	t.Helper()
	p := &parser{name: "test"}
	top, err := p.topNode(data)
	assert.NilError(t, err)
	if top == nil {
		return nil
	}
	v, err := toValue(top)
	assert.NilError(t, err)
	return v
}

// TestErrorGolden loads every testdata/errors/*.yaml: each must fail with
// the code its header names and exactly the message in its .golden file
// (go test ./compose/composefile -update rewrites them), and the JSON
// Schema must agree with Load on the structural cases.
func TestErrorGolden(t *testing.T) {
	schema := compileSchema(t)
	files, err := filepath.Glob("testdata/errors/*.yaml")
	assert.NilError(t, err)
	assert.Assert(t, len(files) > 100)
	abs, err := filepath.Abs("testdata/errors")
	assert.NilError(t, err)
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(file)
			assert.NilError(t, err)
			m := headerRE.FindSubmatch(data)
			assert.Assert(t, m != nil, "first line must be `# code: X schema: reject|accept|skip`")
			wantCode, schemaVerdict := string(m[1]), string(m[2])

			_, err = Load(file, testEnv)
			assert.Assert(t, err != nil, "Load accepted an invalid file")
			var ce *compose.Error
			assert.Assert(t, errors.As(err, &ce), "not a *compose.Error: %T %v", err, err)
			assert.Equal(t, ce.Code, wantCode, ce.Message)
			assert.Assert(t, strings.HasPrefix(ce.Message, file), "message must start with the file: %s", ce.Message)
			msg := strings.ReplaceAll(ce.Message, abs, "<dir>")
			golden.Assert(t, ce.Code+"\n"+msg+"\n", "errors/"+name+".golden")

			switch schemaVerdict {
			case "reject":
				assert.Assert(t, schema.Validate(yamlValue(t, data)) != nil, "the schema accepts a file Load rejects structurally")
			case "accept":
				assert.NilError(t, schema.Validate(yamlValue(t, data)), "the schema rejects a file whose error only Load can see")
			}
		})
	}
}

// fileCodes are the codes composefile itself returns; each must have a
// case in testdata/errors so its message has a golden file.
var fileCodes = []string{
	compose.CodeComposeFileUnreadable, compose.CodeInvalidComposeFile, compose.CodeEmptyContainers,
	compose.CodeInvalidDuration, compose.CodeUnknownDependency, compose.CodeSelfDependency,
	compose.CodeDependencyCycle, compose.CodeUnsupportedWorkerSource, compose.CodeUndefinedVariable,
	compose.CodeInvalidReference, compose.CodeUnterminatedReference, compose.CodeMissingVersionForPackage,
	compose.CodeRuntimeOnlyForBundles, compose.CodePackageRunRequiresHostRuntime,
	compose.CodePreRunTimeoutWithoutPreRun, compose.CodeReservedEnvOverride, compose.CodeMissingEnvFile,
	compose.CodeInvalidNamespace, compose.CodeEngineWorkerIsInjected, compose.CodeUnsupportedEngineWorker,
	compose.CodeInvalidEngineWorkerConfig, compose.CodeInvalidManagedEngineURL,
	compose.CodeManagedEngineEndpointMismatch, compose.CodeSandboxConfigMoved,
}

func TestEveryFileCodeHasACase(t *testing.T) {
	files, err := filepath.Glob("testdata/errors/*.yaml")
	assert.NilError(t, err)
	seen := map[string]bool{compose.CodeComposeFileUnreadable: true} // TestUnreadable
	for _, f := range files {
		data, err := os.ReadFile(f)
		assert.NilError(t, err)
		if m := headerRE.FindSubmatch(data); m != nil {
			seen[string(m[1])] = true
		}
	}
	var missing []string
	for _, c := range fileCodes {
		if !seen[c] {
			missing = append(missing, c)
		}
	}
	sort.Strings(missing)
	assert.DeepEqual(t, missing, []string(nil))
}

// TestUnreadable covers COMPOSE_FILE_UNREADABLE, which no file content can
// produce.
func TestUnreadable(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, path string
	}{
		{"missing", filepath.Join(dir, "worker-compose.yaml")},
		{"directory", dir},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.path, nil)
			assert.Equal(t, compose.CodeOf(err), compose.CodeComposeFileUnreadable)
			msg := strings.ReplaceAll(err.(*compose.Error).Message, dir, "<dir>")
			golden.Assert(t, msg+"\n", "errors/unreadable_"+tc.name+".golden")
		})
	}
	if os.Getuid() != 0 {
		t.Run("permission", func(t *testing.T) {
			p := filepath.Join(dir, "locked.yaml")
			assert.NilError(t, os.WriteFile(p, []byte("containers: {}\n"), 0o000))
			_, err := Load(p, nil)
			assert.Equal(t, compose.CodeOf(err), compose.CodeComposeFileUnreadable)
		})
	}
}

func TestCodesAreUniqueAndUpperCase(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range compose.Codes() {
		assert.Assert(t, regexp.MustCompile(`^[A-Z][A-Z_]+$`).MatchString(c), c)
		assert.Assert(t, !seen[c], "duplicate code %s", c)
		seen[c] = true
	}
	for _, c := range fileCodes {
		assert.Assert(t, seen[c], "%s missing from compose.Codes()", c)
	}
}

func TestComposeError(t *testing.T) {
	err := error(compose.New(compose.CodeSelfDependency, "x.yaml:3: bad"))
	assert.Equal(t, err.Error(), "SELF_DEPENDENCY: x.yaml:3: bad")
	body := err.(*compose.Error).ErrorBody()
	assert.Equal(t, body.Code, compose.CodeSelfDependency)
	assert.Equal(t, body.Message, "x.yaml:3: bad")
	wrapped := fmt.Errorf("load: %w", err)
	assert.Equal(t, compose.CodeOf(wrapped), compose.CodeSelfDependency)
	assert.Assert(t, errors.Is(wrapped, &compose.Error{Code: compose.CodeSelfDependency}))
	assert.Assert(t, !errors.Is(wrapped, &compose.Error{Code: compose.CodeDependencyCycle}))
	assert.Equal(t, compose.CodeOf(errors.New("plain")), "")
	assert.Equal(t, compose.CodeOf(nil), "")
}

func TestParseRefusesHugeInput(t *testing.T) {
	_, err := Parse(make([]byte, maxFileSize+1), FileName, nil)
	assert.Equal(t, compose.CodeOf(err), compose.CodeInvalidComposeFile)
}

package composefile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/iii-sandbox/iii/compose"
)

func seedFromTestdata(f *testing.F, pattern string) {
	files, err := filepath.Glob(pattern)
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
}

func knownCode(code string) bool {
	for _, c := range compose.Codes() {
		if c == code {
			return true
		}
	}
	return false
}

// FuzzLoad: no input panics; every failure is a *compose.Error with a
// known code; every success is a consistent model whose graph orders.
func FuzzLoad(f *testing.F) {
	seedFromTestdata(f, "testdata/valid/*.yaml")
	seedFromTestdata(f, "testdata/errors/*.yaml")
	f.Add([]byte(Example()))
	path := filepath.Join("testdata", "valid", FileName)
	schema := compileSchemaF(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data, path, testEnv)
		if err != nil {
			var ce *compose.Error
			if !errors.As(err, &ce) || !knownCode(ce.Code) || ce.Message == "" {
				t.Fatalf("bad error %T %v", err, err)
			}
			return
		}
		// What Load accepts, the schema accepts (it sees the file as
		// written, references unexpanded).
		p := &parser{name: "fuzz"}
		top, err := p.topNode(data)
		if err != nil {
			t.Fatalf("topNode after a successful Parse: %v", err)
		}
		value, err := toValue(top)
		if err != nil {
			t.Fatal(err)
		}
		if err := schema.Validate(value); err != nil {
			t.Fatalf("schema rejects a file Load accepts: %v", err)
		}
		if len(file.Order) != len(file.Containers) {
			t.Fatalf("order %v vs %d containers", file.Order, len(file.Containers))
		}
		if len(file.Containers) == 0 && file.Engine == nil {
			t.Fatal("empty project accepted")
		}
		order, err := file.StartOrder()
		if err != nil || len(order) != len(file.Order) {
			t.Fatalf("start order %v: %v", order, err)
		}
		pos := map[string]int{}
		for i, k := range order {
			pos[k] = i
		}
		for _, k := range file.Order {
			c := file.Containers[k]
			if c.Key != k || c.Environment == nil {
				t.Fatalf("container %q inconsistent", k)
			}
			for _, d := range c.StartAfter {
				if pos[d] >= pos[k] {
					t.Fatalf("%s starts before its dependency %s", k, d)
				}
			}
			_ = file.Dependents(k)
		}
	})
}

func FuzzParseEnvFile(f *testing.F) {
	seedFromTestdata(f, "testdata/valid/fixtures/*.env")
	seedFromTestdata(f, "testdata/errors/fixtures/*.env")
	f.Add([]byte("export A=\"x\\n\" # c\nB='y'\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := ParseEnvFile(data, "fuzz.env")
		if err != nil {
			var ce *compose.Error
			if !errors.As(err, &ce) || !knownCode(ce.Code) {
				t.Fatalf("bad error %T %v", err, err)
			}
			return
		}
		for k := range env {
			if !envNameRE.MatchString(k) || IsReservedEnv(k) {
				t.Fatalf("accepted key %q", k)
			}
		}
	})
}

func FuzzInterpolate(f *testing.F) {
	for _, s := range []string{"${A}", "$${A}", "${A:-x}", "${", "$", "${A:-${B}}", "a $B ${C:-} d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, err := Interpolate(s, func(k string) (string, bool) { return "v", k == "A" })
		if err != nil {
			switch compose.CodeOf(err) {
			case compose.CodeUndefinedVariable, compose.CodeInvalidReference, compose.CodeUnterminatedReference:
			default:
				t.Fatalf("bad error %v", err)
			}
			return
		}
		// Without "${" nothing changes.
		if !containsRef(s) && out != s {
			t.Fatalf("%q changed to %q", s, out)
		}
	})
}

func containsRef(s string) bool {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '$' && s[i+1] == '{' {
			return true
		}
	}
	return false
}

func compileSchemaF(f *testing.F) *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(Schema()))
	if err != nil {
		f.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("worker-compose.yaml", doc); err != nil {
		f.Fatal(err)
	}
	s, err := c.Compile("worker-compose.yaml")
	if err != nil {
		f.Fatal(err)
	}
	return s
}

package configuration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/message"
)

// noLoader refuses every external $ref. The library's default loader reads
// file:// URLs, and schemas arrive from any connected worker: a schema must
// never make the engine open files or reach the network.
type noLoader struct{}

func (noLoader) Load(u string) (any, error) {
	return nil, fmt.Errorf("external schema references are not allowed (%s); inline the schema or use $defs", u)
}

// compileSchema compiles a worker's JSON Schema. A schema without $schema
// is read as draft 2020-12.
func compileSchema(id string, raw json.RawMessage) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	switch doc.(type) {
	case map[string]any, bool:
	default:
		return nil, errors.New("a JSON Schema is an object (or true/false)")
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	c.DefaultDraft(jsonschema.Draft2020)
	loc := "urn:iii:configuration:" + url.PathEscape(id)
	if err := c.AddResource(loc, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(loc)
	if err != nil {
		return nil, cleanSchemaError(err, loc)
	}
	return s, nil
}

func cleanSchemaError(err error, loc string) error {
	return errors.New(strings.ReplaceAll(err.Error(), loc, "schema"))
}

// validate checks a JSON value against a compiled schema and returns every
// violation, one line each, sorted by where it is in the value.
func validate(p *message.Printer, s *jsonschema.Schema, value json.RawMessage) ([]string, error) {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(value))
	if err != nil {
		return nil, fmt.Errorf("value is not valid JSON: %v", err)
	}
	err = s.Validate(inst)
	if err == nil {
		return nil, nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []string{err.Error()}, nil
	}
	return violations(p, ve), nil
}

// violations flattens a validation error to its leaves: the intermediate
// "does not validate with ..." units repeat what their causes say.
func violations(p *message.Printer, ve *jsonschema.ValidationError) []string {
	var out []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			loc := "/" + strings.Join(e.InstanceLocation, "/")
			out = append(out, fmt.Sprintf("at %s: %s", loc, describeKind(p, e.ErrorKind)))
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	sort.Strings(out)
	return dedupe(out)
}

// describeKind renders one violation. Numeric bounds are formatted here:
// the library's printer groups digits ("65,535"), which reads wrong for
// ports, sizes and ids.
func describeKind(p *message.Printer, k jsonschema.ErrorKind) string {
	rat := func(r *big.Rat) string {
		if r == nil {
			return "?"
		}
		if r.IsInt() {
			return r.Num().String()
		}
		f, _ := r.Float64()
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	switch k := k.(type) {
	case *kind.Minimum:
		return fmt.Sprintf("minimum: got %s, want %s", rat(k.Got), rat(k.Want))
	case *kind.Maximum:
		return fmt.Sprintf("maximum: got %s, want %s", rat(k.Got), rat(k.Want))
	case *kind.ExclusiveMinimum:
		return fmt.Sprintf("exclusiveMinimum: got %s, want more than %s", rat(k.Got), rat(k.Want))
	case *kind.ExclusiveMaximum:
		return fmt.Sprintf("exclusiveMaximum: got %s, want less than %s", rat(k.Got), rat(k.Want))
	case *kind.MultipleOf:
		return fmt.Sprintf("multipleOf: got %s, want a multiple of %s", rat(k.Got), rat(k.Want))
	case *kind.MinLength:
		return fmt.Sprintf("minLength: got %d, want %d", k.Got, k.Want)
	case *kind.MaxLength:
		return fmt.Sprintf("maxLength: got %d, want %d", k.Got, k.Want)
	case *kind.MinItems:
		return fmt.Sprintf("minItems: got %d, want %d", k.Got, k.Want)
	case *kind.MaxItems:
		return fmt.Sprintf("maxItems: got %d, want %d", k.Got, k.Want)
	case *kind.MinProperties:
		return fmt.Sprintf("minProperties: got %d, want %d", k.Got, k.Want)
	case *kind.MaxProperties:
		return fmt.Sprintf("maxProperties: got %d, want %d", k.Got, k.Want)
	}
	return k.LocalizedString(p)
}

func dedupe(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

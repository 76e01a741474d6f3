// Package schemadoc renders a function's JSON Schema as readable help text
// for `iii call -h FUNCTION`: one row per field with its type, whether it is
// required, its default and its description. Nested object fields appear as
// dotted paths (opts.retries), array element fields as path[].field.
//
// Schemas come from other workers, so anything goes: the renderer never
// panics, never follows $ref, and bounds its depth and output.
package schemadoc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// Limits that keep a hostile or huge schema from flooding the terminal.
const (
	maxDepth  = 6
	maxFields = 200
	maxCell   = 120 // runes per default/enum cell
)

// Field is one documented field of a schema.
type Field struct {
	Path        string
	Type        string
	Required    bool
	Default     string // compact JSON; "" when none
	Description string
	Enum        []string // compact JSON of each allowed value
}

// Doc is a schema reduced to what help text shows.
type Doc struct {
	Type        string // the top-level type ("object", "string", ...; "any" when unconstrained)
	Description string
	Fields      []Field
	Truncated   bool // more fields than shown
}

// Parse reads a JSON Schema document.
func Parse(raw json.RawMessage) (*Doc, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, errors.New("empty schema")
	}
	var n node
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("schema is not a JSON Schema object: %w", err)
	}
	d := &Doc{Type: n.typeName(), Description: oneLine(n.Description)}
	d.walk("", &n, 0)
	return d, nil
}

func (d *Doc) walk(prefix string, n *node, depth int) {
	if depth >= maxDepth {
		return
	}
	required := make(map[string]bool, len(n.Required))
	for _, r := range n.Required {
		required[r] = true
	}
	for _, m := range n.Properties {
		if len(d.Fields) >= maxFields {
			d.Truncated = true
			return
		}
		p := m.schema
		f := Field{Path: prefix + m.name, Type: p.typeName(), Required: required[m.name],
			Description: oneLine(p.Description)}
		if len(p.Default) > 0 {
			f.Default = clip(compact(p.Default))
		}
		for _, e := range p.Enum {
			f.Enum = append(f.Enum, clip(compact(e)))
		}
		d.Fields = append(d.Fields, f)
		if len(p.Properties) > 0 {
			d.walk(f.Path+".", p, depth+1)
		}
		if p.Items != nil && len(p.Items.Properties) > 0 {
			d.walk(f.Path+"[].", p.Items, depth+1)
		}
	}
}

// Render writes the doc as an indented table.
func (d *Doc) Render(w io.Writer, indent string) error {
	var b bytes.Buffer
	if d.Description != "" {
		fmt.Fprintf(&b, "%s%s\n", indent, d.Description)
	}
	if len(d.Fields) == 0 {
		fmt.Fprintf(&b, "%sType: %s\n", indent, d.Type)
		_, err := w.Write(b.Bytes())
		return err
	}
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%sFIELD\tTYPE\tREQUIRED\tDEFAULT\tDESCRIPTION\n", indent)
	for _, f := range d.Fields {
		req := "no"
		if f.Required {
			req = "yes"
		}
		def := f.Default
		if def == "" {
			def = "-"
		}
		desc := f.Description
		if len(f.Enum) > 0 {
			oneOf := "one of: " + clip(strings.Join(f.Enum, ", "))
			if desc == "" {
				desc = oneOf
			} else {
				desc += " (" + oneOf + ")"
			}
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\n", indent, cell(f.Path), cell(f.Type), req, cell(def), cell(desc))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The padding of an empty last column would leave trailing blanks.
	for line := range strings.Lines(table.String()) {
		b.WriteString(strings.TrimRight(line, " \n"))
		b.WriteByte('\n')
	}
	if d.Truncated {
		fmt.Fprintf(&b, "%s(more fields not shown)\n", indent)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// node is the part of a JSON Schema that help text uses. Unknown keywords
// are ignored; a keyword of an unexpected JSON type is treated as absent.
type node struct {
	Type        json.RawMessage
	Description string
	Properties  members
	Required    []string
	Items       *node
	Default     json.RawMessage
	Enum        []json.RawMessage
	Const       json.RawMessage
	Ref         string
	AnyOf       []*node
	OneOf       []*node
	Format      string
}

// UnmarshalJSON is lenient: a schema may be `true`/`false`, and each
// keyword is decoded on its own so one odd keyword does not hide the rest.
func (n *node) UnmarshalJSON(data []byte) error {
	var kw map[string]json.RawMessage
	if err := json.Unmarshal(data, &kw); err != nil {
		var b bool
		if json.Unmarshal(data, &b) == nil {
			return nil // boolean schema: anything (true) or nothing (false)
		}
		return err
	}
	n.Type = kw["type"]
	_ = json.Unmarshal(kw["description"], &n.Description)
	if p, ok := kw["properties"]; ok {
		_ = json.Unmarshal(p, &n.Properties)
	}
	_ = json.Unmarshal(kw["required"], &n.Required)
	if it, ok := kw["items"]; ok {
		var items node
		if json.Unmarshal(it, &items) == nil {
			n.Items = &items
		}
	}
	n.Default = kw["default"]
	_ = json.Unmarshal(kw["enum"], &n.Enum)
	n.Const = kw["const"]
	_ = json.Unmarshal(kw["$ref"], &n.Ref)
	_ = json.Unmarshal(kw["anyOf"], &n.AnyOf)
	_ = json.Unmarshal(kw["oneOf"], &n.OneOf)
	_ = json.Unmarshal(kw["format"], &n.Format)
	return nil
}

// typeName is a short human name of what the schema accepts.
func (n *node) typeName() string {
	return n.typeNameDepth(0)
}

func (n *node) typeNameDepth(depth int) string {
	if n == nil || depth > maxDepth {
		return "any"
	}
	var names []string
	var one string
	var many []string
	switch {
	case json.Unmarshal(n.Type, &one) == nil && one != "":
		names = []string{one}
	case json.Unmarshal(n.Type, &many) == nil && len(many) > 0:
		names = many
	}
	for i, t := range names {
		if t == "array" && n.Items != nil {
			names[i] = "array of " + n.Items.typeNameDepth(depth+1)
		}
	}
	if len(names) == 1 && names[0] == "string" && n.Format != "" {
		names[0] = "string (" + n.Format + ")"
	}
	if len(names) > 0 {
		return clip(strings.Join(names, "|"))
	}
	switch {
	case n.Ref != "":
		return "see " + clip(n.Ref)
	case len(n.Const) > 0:
		return "const " + clip(compact(n.Const))
	case len(n.Enum) > 0:
		return "enum"
	case len(n.AnyOf) > 0 || len(n.OneOf) > 0:
		var alts []string
		for _, a := range append(append([]*node(nil), n.AnyOf...), n.OneOf...) {
			alts = append(alts, a.typeNameDepth(depth+1))
		}
		return clip(strings.Join(alts, "|"))
	case len(n.Properties) > 0:
		return "object"
	}
	return "any"
}

// member is one property, in the order the schema lists it.
type member struct {
	name   string
	schema *node
}

// members keeps "properties" in document order: help reads best in the
// order the function's author chose.
type members []member

func (ms *members) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != json.Delim('{') {
		return errors.New("properties is not an object")
	}
	seen := map[string]int{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name, ok := tok.(string)
		if !ok {
			return errors.New("property name is not a string")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		var n node
		if json.Unmarshal(raw, &n) != nil {
			n = node{}
		}
		if i, dup := seen[name]; dup {
			(*ms)[i].schema = &n
			continue
		}
		seen[name] = len(*ms)
		*ms = append(*ms, member{name: name, schema: &n})
	}
	return nil
}

func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// oneLine folds whitespace so a multi-line description stays in its cell.
func oneLine(s string) string { return clipN(strings.Join(strings.Fields(s), " "), 4*maxCell) }

func clip(s string) string { return clipN(s, maxCell) }

func clipN(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// cell keeps a table cell on one line and free of the tab that would
// break the columns.
func cell(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

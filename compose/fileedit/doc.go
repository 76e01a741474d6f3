package fileedit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/compose/yamlbuild"
)

// Doc is a compose file being edited: its lines, and the YAML tree
// that says where things are. Edits replace or insert whole lines, so
// everything else (comments, blank lines, quoting, key order) stays
// byte for byte.
type Doc struct {
	// Path is the file, as Read was given it.
	Path  string
	mode  os.FileMode
	lines []string
	root  *yaml.Node // the top mapping
}

func Read(p string) (*Doc, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, compose.New(compose.CodeComposeFileUnreadable, fmt.Sprintf("cannot read %s: %v", p, unwrapPathErr(err)))
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, compose.New(compose.CodeComposeFileUnreadable, fmt.Sprintf("cannot read %s: %v", p, unwrapPathErr(err)))
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf("%s is not a YAML mapping that Compose can edit", p))
	}
	text := strings.TrimSuffix(string(data), "\n")
	return &Doc{Path: p, mode: st.Mode().Perm(), lines: strings.Split(text, "\n"), root: doc.Content[0]}, nil
}

// Bytes is the edited text.
func (d *Doc) Bytes() []byte { return []byte(strings.Join(d.lines, "\n") + "\n") }

// containers returns the containers: key and value nodes (nil when the key
// is absent).
func (d *Doc) containers() (*yaml.Node, *yaml.Node) {
	for i := 0; i+1 < len(d.root.Content); i += 2 {
		if d.root.Content[i].Value == "containers" {
			return d.root.Content[i], d.root.Content[i+1]
		}
	}
	return nil, nil
}

// nextTopLine is the 0-based line of the first top-level key after line
// (0-based), or len(lines).
func (d *Doc) nextTopLine(after int) int {
	next := len(d.lines)
	for i := 0; i+1 < len(d.root.Content); i += 2 {
		if l := d.root.Content[i].Line - 1; l > after && l < next {
			next = l
		}
	}
	return next
}

// region is the lines [start, end) of the i-th container of the
// containers mapping: from its key to the line before the next key,
// without trailing blank lines or comments that sit at the key's level or
// left of it (those belong to what follows).
func (d *Doc) region(cv *yaml.Node, i int) (int, int) {
	k := cv.Content[2*i]
	start := k.Line - 1
	end := 0
	if 2*i+2 < len(cv.Content) {
		end = cv.Content[2*i+2].Line - 1
	} else {
		ck, _ := d.containers()
		end = d.nextTopLine(ck.Line - 1)
	}
	indent := k.Column - 1
	for end > start+1 {
		l := d.lines[end-1]
		t := strings.TrimSpace(l)
		if t == "" || (strings.HasPrefix(t, "#") && leading(l) <= indent) {
			end--
			continue
		}
		break
	}
	return start, end
}

func leading(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }

// Render writes `key: value` as block YAML indented by indent spaces, with
// step spaces per level.
func Render(key string, val *yaml.Node, indent, step int) ([]string, error) {
	m := yamlbuild.Map(yamlbuild.Str(key), val)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(step)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	pad := strings.Repeat(" ", indent)
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		if l == "" {
			out = append(out, l)
			continue
		}
		out = append(out, pad+l)
	}
	return out, nil
}

// layout is the indentation the containers mapping uses (2 and 2 when it
// has no entry to copy).
func (d *Doc) layout(cv *yaml.Node) (indent, step int) {
	indent, step = 2, 2
	if cv != nil && cv.Kind == yaml.MappingNode && len(cv.Content) >= 2 && cv.Style&yaml.FlowStyle == 0 {
		indent = cv.Content[0].Column - 1
		if v := cv.Content[1]; v.Kind == yaml.MappingNode && len(v.Content) > 0 && v.Style&yaml.FlowStyle == 0 {
			if s := v.Content[0].Column - 1 - indent; s > 0 {
				step = s
			}
		}
	}
	return indent, step
}

// blockEditable reports whether the containers value can be edited line by
// line: a block mapping, or nothing yet.
func blockEditable(cv *yaml.Node) bool {
	if cv == nil {
		return true
	}
	if cv.Kind == yaml.ScalarNode && cv.Tag == "!!null" {
		return true
	}
	if cv.Kind != yaml.MappingNode {
		return false
	}
	if cv.Style&yaml.FlowStyle != 0 {
		return len(cv.Content) == 0
	}
	for i := 1; i < len(cv.Content); i += 2 {
		if cv.Content[i].Style&yaml.FlowStyle != 0 || cv.Content[i].Kind != yaml.MappingNode {
			return false
		}
	}
	return true
}

// Upsert puts a container block in the file: replacing the lines of an
// existing key, or appending after the last container.
func (d *Doc) Upsert(key string, val *yaml.Node) error {
	ck, cv := d.containers()
	if !blockEditable(cv) {
		return d.reencode(func() { setEntry(cv, key, val) })
	}
	indent, step := d.layout(cv)
	block, err := Render(key, val, indent, step)
	if err != nil {
		return err
	}
	if ck == nil {
		if len(d.lines) > 0 && strings.TrimSpace(d.lines[len(d.lines)-1]) != "" {
			d.lines = append(d.lines, "")
		}
		d.lines = append(d.lines, "containers:")
		d.lines = append(d.lines, block...)
		return nil
	}
	if cv.Kind != yaml.MappingNode || len(cv.Content) == 0 {
		// containers: with nothing, or {}: the key line keeps only the key.
		l := ck.Line - 1
		line := d.lines[l]
		if cv.Kind == yaml.MappingNode && cv.Line == ck.Line {
			// containers: {} (possibly with a trailing comment)
			rest := line[cv.Column-1:]
			closing := strings.Index(rest, "}")
			line = strings.TrimRight(line[:cv.Column-1], " ") + rest[closing+1:]
		}
		d.lines[l] = line
		d.insert(l+1, block)
		return nil
	}
	for i := 0; 2*i < len(cv.Content); i++ {
		if cv.Content[2*i].Value == key {
			s, e := d.region(cv, i)
			d.replace(s, e, block)
			return nil
		}
	}
	_, e := d.region(cv, len(cv.Content)/2-1)
	if d.separated(cv) {
		block = append([]string{""}, block...)
	}
	d.insert(e, block)
	return nil
}

// separated reports whether the file puts a blank line between
// containers, so an appended one follows suit.
func (d *Doc) separated(cv *yaml.Node) bool {
	if len(cv.Content) < 4 {
		return false
	}
	_, e := d.region(cv, 0)
	next := cv.Content[2].Line - 1
	for l := e; l < next; l++ {
		if strings.TrimSpace(d.lines[l]) == "" {
			return true
		}
	}
	return false
}

// headComments is where the comment lines right above line start begin
// (comments at the key's indentation, with no blank line between).
func (d *Doc) headComments(start, indent int) int {
	for start > 0 {
		l := d.lines[start-1]
		if strings.HasPrefix(strings.TrimSpace(l), "#") && leading(l) == indent {
			start--
			continue
		}
		break
	}
	return start
}

// Delete removes a container's lines; an emptied containers: becomes {}.
func (d *Doc) Delete(key string) error {
	ck, cv := d.containers()
	if cv == nil || cv.Kind != yaml.MappingNode {
		return compose.New(compose.CodeUnknownContainer, fmt.Sprintf("%s declares no container %q", d.Path, key))
	}
	if !blockEditable(cv) {
		return d.reencode(func() {
			for i := 0; i+1 < len(cv.Content); i += 2 {
				if cv.Content[i].Value == key {
					cv.Content = append(cv.Content[:i], cv.Content[i+2:]...)
					return
				}
			}
		})
	}
	for i := 0; 2*i < len(cv.Content); i++ {
		if cv.Content[2*i].Value != key {
			continue
		}
		s, e := d.region(cv, i)
		s = d.headComments(s, cv.Content[2*i].Column-1)
		d.replace(s, e, nil)
		// Keep one blank line where there was one on each side, none after
		// the containers: key itself.
		keyLine := ck.Line - 1
		switch {
		case s < len(d.lines) && strings.TrimSpace(d.lines[s]) == "" && s-1 == keyLine:
			d.replace(s, s+1, nil)
		case s > 0 && strings.TrimSpace(d.lines[s-1]) == "" && (s == len(d.lines) || strings.TrimSpace(d.lines[s]) == ""):
			d.replace(s-1, s, nil)
		}
		if len(cv.Content) == 2 {
			// The last container went: containers: {} keeps the file valid
			// (with engine:) and says so.
			line := d.lines[keyLine]
			at := ck.Column - 1 + len(ck.Value) + 1
			if at <= len(line) && line[at-1] == ':' {
				d.lines[keyLine] = line[:at] + " {}" + line[at:]
			} else {
				d.lines[keyLine] = strings.TrimRight(line, " ") + " {}"
			}
		}
		return nil
	}
	return compose.New(compose.CodeUnknownContainer, fmt.Sprintf("%s declares no container %q", d.Path, key))
}

// Text is the edited text without its final newline: equal texts mean
// an edit changed nothing.
func (d *Doc) Text() string { return strings.Join(d.lines, "\n") }

// Reparse reads the edited lines back into a tree: an edit moves the
// positions the next one needs.
func (d *Doc) Reparse() error {
	var doc yaml.Node
	if err := yaml.Unmarshal(d.Bytes(), &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf("the edit of %s did not produce valid YAML; the file was not written", d.Path))
	}
	d.root = doc.Content[0]
	return nil
}

func (d *Doc) insert(at int, block []string) {
	d.lines = slices.Insert(d.lines, at, block...)
}

func (d *Doc) replace(s, e int, block []string) {
	d.lines = slices.Replace(d.lines, s, e, block...)
}

// reencode applies edit to the tree and writes the whole document again:
// the fallback for a containers: mapping in flow style, which lines cannot
// be cut out of. Comments survive; blank lines and flow layout do not.
func (d *Doc) reencode(edit func()) error {
	edit()
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{d.root}}); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	d.lines = strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	return nil
}

func setEntry(m *yaml.Node, key string, val *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = val
			return
		}
	}
	m.Content = append(m.Content, yamlbuild.Str(key), val)
}

// Node returns the value node of containers.<key> in the file.
func (d *Doc) Node(key string) *yaml.Node {
	_, cv := d.containers()
	return yamlbuild.Child(cv, key)
}

// Merged is the container value after an Addition: an existing
// container's fields stay unless supplied (a supplied field replaces the
// whole field), in the canonical field order for new ones.
func (a *Addition) Merged(existing *yaml.Node) *yaml.Node {
	out := yamlbuild.Map()
	if existing != nil && existing.Kind == yaml.MappingNode {
		c := *existing
		c.Content = slices.Clone(existing.Content)
		out = &c
	}
	for _, k := range containerFields {
		if v, ok := a.Fields[k]; ok {
			setEntry(out, k, v)
		}
	}
	return out
}

// Parse validates the edited text as a full compose file, without
// writing it.
func (d *Doc) Parse(lookup func(string) (string, bool)) (*composefile.File, error) {
	f, err := composefile.Parse(d.Bytes(), d.Path, lookup)
	if err != nil {
		ce := codedError(err)
		return nil, compose.New(ce.Code, "the edit was not written, because the edited file would not load: "+ce.Message)
	}
	return f, nil
}

// Commit validates the edited text as a full compose file and writes it
// atomically, keeping the file's mode. A file that would not load is not
// written.
func (d *Doc) Commit(lookup func(string) (string, bool)) (*composefile.File, error) {
	data := d.Bytes()
	f, err := d.Parse(lookup)
	if err != nil {
		return nil, err
	}
	if err := state.WriteFileAtomic(d.Path, data, d.mode); err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("write %s: %v", d.Path, err))
	}
	return f, nil
}

// NodeText renders a node for comparisons.
func NodeText(n *yaml.Node) string {
	if n == nil {
		return ""
	}
	lines, err := Render("x", n, 0, 2)
	if err != nil {
		return ""
	}
	return strings.Join(lines, "\n")
}

// KindOf reads the source kind of a container node's worker: value.
func KindOf(n *yaml.Node) composefile.SourceKind {
	w := yamlbuild.Child(n, "worker")
	if w == nil {
		return ""
	}
	switch {
	case strings.HasPrefix(w.Value, "path://"):
		return composefile.SourcePath
	case strings.HasPrefix(w.Value, "package://"):
		return composefile.SourcePackage
	}
	return ""
}

// unwrapPathErr drops the *os.PathError around err: the messages name
// the file themselves.
func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// codedError gives a failure to load the edited file a code: its own, or
// IO_ERROR.
func codedError(err error) *compose.Error {
	var ce *compose.Error
	if errors.As(err, &ce) {
		return ce
	}
	return compose.New(compose.CodeIOError, err.Error())
}

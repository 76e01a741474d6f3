package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/internal/lazyre"
)

// AliasSandbox is the compose::add alias for the sandbox adapter.
const AliasSandbox = "iii-sandbox"

// containerFields are the fields a compose::add container object may
// carry, in the order Compose writes them.
var containerFields = []string{"worker", "version", "runtime", "start_after", "config_name", "config_override",
	"working_dir", "environment", "env_file", "startup_timeout", "scripts"}

// addition is one worker compose::add puts in the file: its container key
// and the fields supplied (as YAML nodes).
type addition struct {
	key    string
	kind   composefile.SourceKind
	fields map[string]*yaml.Node
	// src is the registry package of a package:// addition.
	src composefile.Source
	// latest asks for the package's latest version, written exact.
	latest bool
	// generated marks a dependency the registry graph of another addition
	// pulled in.
	generated bool
}

func scalar(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

// versionNode writes a selector quoted, as the docs do: ^ and ~ read oddly
// bare, and 0.21 would be a number.
func versionNode(s string) *yaml.Node {
	n := scalar(s)
	n.Style = yaml.SingleQuotedStyle
	return n
}

// parseWorkerSpec reads a worker spec string: iii-sandbox (the adapter
// alias), path://dir, ./dir or /dir (a path worker), or a registry package:
// name, name@selector, host/name[@selector], or package://… . An unpinned
// package is marked for resolving to its exact latest version (the sandbox
// adapter instead gets the contract range Compose pins it to).
func parseWorkerSpec(spec string) (*addition, error) {
	s := strings.TrimSpace(spec)
	bad := func(why string) error {
		return compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("worker spec %q: %s", clip(spec, 120), why))
	}
	if s == "" {
		return nil, bad("it is empty; pass a directory (./workers/api), path://dir, a registry package (name, name@version, host/name) or iii-sandbox")
	}
	if s == AliasSandbox {
		return adapterAddition(composefile.AdapterPackage, composefile.AdapterSelector), nil
	}
	dir, isPath := strings.CutPrefix(s, "path://")
	if !isPath && (strings.HasPrefix(s, ".") || strings.HasPrefix(s, "/")) {
		dir, isPath = s, true
	}
	if isPath {
		if dir == "" {
			return nil, bad("path:// needs a directory")
		}
		key := path.Base(path.Clean(filepath.ToSlash(dir)))
		if key == "." || key == "/" || key == ".." {
			return nil, bad("the container key is the directory's last segment, and this path has none; name the directory")
		}
		return &addition{key: key, kind: composefile.SourcePath, fields: map[string]*yaml.Node{"worker": scalar("path://" + dir)}}, nil
	}
	if strings.Contains(s, "://") && !strings.HasPrefix(s, "package://") {
		return nil, bad("only path:// and package:// references are workers")
	}
	ref := strings.TrimPrefix(s, "package://")
	name, sel, hasSel := strings.Cut(ref, "@")
	if hasSel && sel == "" {
		return nil, bad("nothing after @; write name@<version, range or tag>")
	}
	if hasSel {
		if err := registry.CheckSelector(sel); err != nil {
			return nil, bad(err.Error())
		}
	}
	host, base := "", name
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		host, base = name[:i], name[i+1:]
		if host == "" || strings.Contains(host, "/") || !registryHostRE.MatchString(host) {
			return nil, bad("write name, name@version or <registry-host>/name")
		}
	}
	if !registry.PathSafe(base) {
		return nil, bad("a package name has letters, digits, ., _ and -, starting with a letter or digit")
	}
	a := &addition{key: base, kind: composefile.SourcePackage, fields: map[string]*yaml.Node{"worker": scalar("package://" + name)},
		src: composefile.Source{Kind: composefile.SourcePackage, Registry: host, Name: base}}
	switch {
	case hasSel:
		a.fields["version"] = versionNode(sel)
	case base == composefile.AdapterPackage:
		// The adapter is pinned to the sandbox contract this engine
		// serves, not to whatever version is newest.
		a.fields["version"] = versionNode(composefile.AdapterSelector)
	default:
		a.latest = true
	}
	return a, nil
}

// registryHostRE is a registry host with an optional port.
var registryHostRE = lazyre.New(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})(:[0-9]{1,5})?$`)

func adapterAddition(name, sel string) *addition {
	return &addition{key: name, kind: composefile.SourcePackage, fields: map[string]*yaml.Node{
		"worker": scalar("package://" + name), "version": versionNode(sel)},
		src: composefile.Source{Kind: composefile.SourcePackage, Name: name}}
}

// parseContainerObject reads a compose::add container object.
func parseContainerObject(raw json.RawMessage) (*addition, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("a container object must be a JSON object: %v", err))
	}
	for k := range obj {
		if !slices.Contains(containerFields, k) {
			return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("unknown field %q in a container object; the fields are %s", k, strings.Join(containerFields, ", ")))
		}
	}
	var worker string
	if err := json.Unmarshal(obj["worker"], &worker); err != nil || worker == "" {
		return nil, compose.New(compose.CodeInvalidWorkerSpec, "a container object needs worker (a string)")
	}
	a, err := parseWorkerSpec(worker)
	if err != nil {
		return nil, err
	}
	if a.kind == composefile.SourcePath {
		a.fields["worker"] = scalar(ensureScheme(worker))
	}
	for _, k := range containerFields {
		v, ok := obj[k]
		if !ok || k == "worker" {
			continue
		}
		var val any
		if err := json.Unmarshal(v, &val); err != nil {
			return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("field %s: %v", k, err))
		}
		if k == "version" {
			s, ok := val.(string)
			if !ok {
				return nil, compose.New(compose.CodeInvalidWorkerSpec, "version must be a string")
			}
			if old := a.fields["version"]; old != nil && strings.Contains(worker, "@") && old.Value != s {
				return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("version %q disagrees with the @%s in worker %q", s, old.Value, worker))
			}
			if a.kind == composefile.SourcePackage {
				if err := registry.CheckSelector(s); err != nil {
					return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("version: %v", err))
				}
			}
			a.fields[k] = versionNode(s)
			a.latest = false
			continue
		}
		n := &yaml.Node{}
		if err := n.Encode(val); err != nil {
			return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("field %s: %v", k, err))
		}
		a.fields[k] = n
	}
	return a, nil
}

func ensureScheme(w string) string {
	if strings.HasPrefix(w, "path://") {
		return w
	}
	return "path://" + w
}

// parseAdditions reads worker= (string) or workers= (strings or container
// objects; it wins when both are given).
func parseAdditions(r *request) ([]*addition, error) {
	var raws []json.RawMessage
	if t := bytes.TrimSpace(r.Workers); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if err := json.Unmarshal(t, &raws); err != nil || len(raws) == 0 {
			return nil, compose.New(compose.CodeInvalidWorkerSpec, "workers must be a non-empty list of worker specs or container objects")
		}
	} else if t := bytes.TrimSpace(r.Worker); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if t[0] == '[' {
			if err := json.Unmarshal(t, &raws); err != nil || len(raws) == 0 {
				return nil, compose.New(compose.CodeInvalidWorkerSpec, "worker must be a worker spec (or a list of them)")
			}
		} else {
			raws = []json.RawMessage{t}
		}
	} else {
		return nil, compose.New(compose.CodeInvalidWorkerSpec, "compose::add needs worker=<spec> or workers=[...]; for example worker=./workers/api or worker=iii-sandbox")
	}
	var out []*addition
	seen := map[string]bool{}
	for _, raw := range raws {
		var a *addition
		var err error
		if len(raw) > 0 && raw[0] == '{' {
			a, err = parseContainerObject(raw)
		} else {
			var s string
			if jerr := json.Unmarshal(raw, &s); jerr != nil {
				return nil, compose.New(compose.CodeInvalidWorkerSpec, "each worker must be a string spec or a container object")
			}
			a, err = parseWorkerSpec(s)
		}
		if err != nil {
			return nil, err
		}
		if seen[a.key] {
			return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("container %q is given twice", a.key))
		}
		seen[a.key] = true
		out = append(out, a)
	}
	return out, nil
}

// ---- text editing ----------------------------------------------------------

// composeDoc is a compose file being edited: its lines, and the YAML tree
// that says where things are. Edits replace or insert whole lines, so
// everything else (comments, blank lines, quoting, key order) stays
// byte for byte.
type composeDoc struct {
	path  string
	mode  os.FileMode
	lines []string
	root  *yaml.Node // the top mapping
}

func readDoc(p string) (*composeDoc, error) {
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
	return &composeDoc{path: p, mode: st.Mode().Perm(), lines: strings.Split(text, "\n"), root: doc.Content[0]}, nil
}

func (d *composeDoc) bytes() []byte { return []byte(strings.Join(d.lines, "\n") + "\n") }

// containers returns the containers: key and value nodes (nil when the key
// is absent).
func (d *composeDoc) containers() (*yaml.Node, *yaml.Node) {
	for i := 0; i+1 < len(d.root.Content); i += 2 {
		if d.root.Content[i].Value == "containers" {
			return d.root.Content[i], d.root.Content[i+1]
		}
	}
	return nil, nil
}

// nextTopLine is the 0-based line of the first top-level key after line
// (0-based), or len(lines).
func (d *composeDoc) nextTopLine(after int) int {
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
func (d *composeDoc) region(cv *yaml.Node, i int) (int, int) {
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

// render writes `key: value` as block YAML indented by indent spaces, with
// step spaces per level.
func render(key string, val *yaml.Node, indent, step int) ([]string, error) {
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{scalar(key), val}}
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
func (d *composeDoc) layout(cv *yaml.Node) (indent, step int) {
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

// upsert puts a container block in the file: replacing the lines of an
// existing key, or appending after the last container.
func (d *composeDoc) upsert(key string, val *yaml.Node) error {
	ck, cv := d.containers()
	if !blockEditable(cv) {
		return d.reencode(func() { setEntry(cv, key, val) })
	}
	indent, step := d.layout(cv)
	block, err := render(key, val, indent, step)
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
func (d *composeDoc) separated(cv *yaml.Node) bool {
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
func (d *composeDoc) headComments(start, indent int) int {
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

// delete removes a container's lines; an emptied containers: becomes {}.
func (d *composeDoc) delete(key string) error {
	ck, cv := d.containers()
	if cv == nil || cv.Kind != yaml.MappingNode {
		return compose.New(compose.CodeUnknownContainer, fmt.Sprintf("%s declares no container %q", d.path, key))
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
	return compose.New(compose.CodeUnknownContainer, fmt.Sprintf("%s declares no container %q", d.path, key))
}

func (d *composeDoc) insert(at int, block []string) {
	d.lines = slices.Insert(d.lines, at, block...)
}

func (d *composeDoc) replace(s, e int, block []string) {
	d.lines = slices.Replace(d.lines, s, e, block...)
}

// reencode applies edit to the tree and writes the whole document again:
// the fallback for a containers: mapping in flow style, which lines cannot
// be cut out of. Comments survive; blank lines and flow layout do not.
func (d *composeDoc) reencode(edit func()) error {
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
	m.Content = append(m.Content, scalar(key), val)
}

// existingNode returns the value node of containers.<key> in the file.
func (d *composeDoc) existingNode(key string) *yaml.Node {
	_, cv := d.containers()
	return child(cv, key)
}

// merged is the container value after an addition: an existing
// container's fields stay unless supplied (a supplied field replaces the
// whole field), in the canonical field order for new ones.
func (a *addition) merged(existing *yaml.Node) *yaml.Node {
	out := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	if existing != nil && existing.Kind == yaml.MappingNode {
		c := *existing
		c.Content = slices.Clone(existing.Content)
		out = &c
	}
	for _, k := range containerFields {
		if v, ok := a.fields[k]; ok {
			setEntry(out, k, v)
		}
	}
	return out
}

// parse validates the edited text as a full compose file, without
// writing it.
func (d *composeDoc) parse(lookup func(string) (string, bool)) (*composefile.File, error) {
	f, err := composefile.Parse(d.bytes(), d.path, lookup)
	if err != nil {
		ce := asComposeError(err)
		return nil, compose.New(ce.Code, "the edit was not written, because the edited file would not load: "+ce.Message)
	}
	return f, nil
}

// commit validates the edited text as a full compose file and writes it
// atomically, keeping the file's mode. A file that would not load is not
// written.
func (d *composeDoc) commit(lookup func(string) (string, bool)) (*composefile.File, error) {
	data := d.bytes()
	f, err := d.parse(lookup)
	if err != nil {
		return nil, err
	}
	if err := state.WriteFileAtomic(d.path, data, d.mode); err != nil {
		return nil, compose.New(compose.CodeIOError, fmt.Sprintf("write %s: %v", d.path, err))
	}
	return f, nil
}

// nodeText renders a node for comparisons.
func nodeText(n *yaml.Node) string {
	if n == nil {
		return ""
	}
	lines, err := render("x", n, 0, 2)
	if err != nil {
		return ""
	}
	return strings.Join(lines, "\n")
}

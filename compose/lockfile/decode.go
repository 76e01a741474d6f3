package lockfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/Masterminds/semver/v3"
	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
)

// maxValueDepth bounds the nesting of default_config.
const maxValueDepth = 64

// decoder walks the YAML tree of a lock so every error names its line and
// path, and no unknown or duplicate key slips through.
type decoder struct {
	path string
}

func (d *decoder) fail(n *yaml.Node, format string, args ...any) *compose.Error {
	where := d.path
	if n != nil && n.Line > 0 {
		where = fmt.Sprintf("%s:%d", d.path, n.Line)
	}
	return compose.New(compose.CodeInvalidComposeLock, where+": "+fmt.Sprintf(format, args...)+
		"; fix it, or delete the lock and run `iii compose build` (or `iii compose --up`) without --frozen to write it again")
}

// Decode reads a lock. path names it in messages.
func Decode(data []byte, path string) (*Lock, error) {
	d := &decoder{path: path}
	if len(data) > MaxSize {
		return nil, d.fail(nil, "the lock is larger than %d MiB", MaxSize>>20)
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, d.fail(nil, "the lock is empty")
		}
		return nil, d.fail(nil, "not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, d.fail(nil, "the lock must be one YAML document")
	}
	if len(doc.Content) != 1 {
		return nil, d.fail(&doc, "the lock is empty")
	}
	top := doc.Content[0]
	fields, err := d.mapping(top, "the lock", "version", "containers", "graphs")
	if err != nil {
		return nil, err
	}
	vn := fields["version"]
	if vn == nil {
		return nil, d.fail(top, "version: is missing; the lock format is version: %d", SchemaVersion)
	}
	if vn.Kind != yaml.ScalarNode || vn.ShortTag() != "!!int" || vn.Value != fmt.Sprint(SchemaVersion) {
		return nil, d.fail(vn, "version must be %d, not %s", SchemaVersion, clip(vn.Value, 40))
	}
	l := New()
	cn := fields["containers"]
	if cn == nil {
		return nil, d.fail(top, "containers: is missing")
	}
	if cn.Kind != yaml.MappingNode {
		return nil, d.fail(cn, "containers must be a mapping from container key to its locked package")
	}
	for i := 0; i+1 < len(cn.Content); i += 2 {
		k, v := cn.Content[i], cn.Content[i+1]
		if k.Kind != yaml.ScalarNode || !keyRE.MatchString(k.Value) {
			return nil, d.fail(k, "%q is not a container key", clip(k.Value, 80))
		}
		if _, dup := l.Containers[k.Value]; dup {
			return nil, d.fail(k, "containers.%s appears twice", k.Value)
		}
		e, err := d.entry(v, "containers."+k.Value)
		if err != nil {
			return nil, err
		}
		l.Containers[k.Value] = e
	}
	if gn := fields["graphs"]; gn != nil {
		if err := d.graphs(gn, l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// mapping checks n is a mapping with only the allowed keys, each once, and
// returns its values by key.
func (d *decoder) mapping(n *yaml.Node, what string, allowed ...string) (map[string]*yaml.Node, error) {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return nil, d.fail(n, "%s uses a YAML anchor or alias, which a lock never has", what)
	}
	if n.Kind != yaml.MappingNode {
		return nil, d.fail(n, "%s must be a mapping", what)
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, d.fail(k, "%s has a key that is not a string", what)
		}
		if !contains(allowed, k.Value) {
			return nil, d.fail(k, "unknown key %q in %s; it has %s", clip(k.Value, 80), what, strings.Join(allowed, ", "))
		}
		if _, dup := out[k.Value]; dup {
			return nil, d.fail(k, "%s has %s twice", what, k.Value)
		}
		if v.Kind == yaml.AliasNode || v.Anchor != "" {
			return nil, d.fail(v, "%s.%s uses a YAML anchor or alias, which a lock never has", what, k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}

// str reads a required non-empty string field.
func (d *decoder) str(fields map[string]*yaml.Node, parent *yaml.Node, key, path string) (string, *yaml.Node, error) {
	n := fields[key]
	if n == nil {
		return "", nil, d.fail(parent, "%s.%s is missing", path, key)
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" || n.Value == "" {
		return "", nil, d.fail(n, "%s.%s must be a non-empty string", path, key)
	}
	return n.Value, n, nil
}

func (d *decoder) entry(n *yaml.Node, path string) (*Entry, error) {
	f, err := d.mapping(n, path, "worker", "requested", "resolved")
	if err != nil {
		return nil, err
	}
	e := &Entry{}
	var wn *yaml.Node
	if e.Worker, wn, err = d.str(f, n, "worker", path); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(e.Worker, PackageScheme) {
		return nil, d.fail(wn, "%s.worker %q must start with %s (only registry packages are locked)", path, clip(e.Worker, 80), PackageScheme)
	}
	if e.Requested, _, err = d.str(f, n, "requested", path); err != nil {
		return nil, err
	}
	rn := f["resolved"]
	if rn == nil {
		return nil, d.fail(n, "%s.resolved is missing", path)
	}
	rpath := path + ".resolved"
	rf, err := d.mapping(rn, rpath, "name", "version", "type", "artifacts", "default_config")
	if err != nil {
		return nil, err
	}
	r := &e.Resolved
	var nn, vn, tn *yaml.Node
	if r.Name, nn, err = d.str(rf, rn, "name", rpath); err != nil {
		return nil, err
	}
	ref := strings.TrimPrefix(e.Worker, PackageScheme)
	if last := ref[strings.LastIndexByte(ref, '/')+1:]; last != r.Name {
		return nil, d.fail(nn, "%s.name %q must equal the last segment of worker %s", rpath, clip(r.Name, 80), clip(e.Worker, 80))
	}
	if !safeRE.MatchString(r.Name) {
		return nil, d.fail(nn, "%s.name %q is not path-safe (letters, digits, ., _ and -)", rpath, clip(r.Name, 80))
	}
	if r.Version, vn, err = d.str(rf, rn, "version", rpath); err != nil {
		return nil, err
	}
	if !safeRE.MatchString(r.Version) {
		return nil, d.fail(vn, "%s.version %q is not path-safe (letters, digits, ., _ and -)", rpath, clip(r.Version, 80))
	}
	if _, err := semver.StrictNewVersion(r.Version); err != nil {
		return nil, d.fail(vn, "%s.version %q is not a semantic version", rpath, clip(r.Version, 80))
	}
	if r.Type, tn, err = d.str(rf, rn, "type", rpath); err != nil {
		return nil, err
	}
	if r.Type != TypeBinary && r.Type != TypeBundle {
		return nil, d.fail(tn, "%s.type %q must be binary or bundle", rpath, clip(r.Type, 40))
	}
	an := rf["artifacts"]
	if an == nil {
		return nil, d.fail(rn, "%s.artifacts is missing", rpath)
	}
	if an.Kind != yaml.MappingNode || len(an.Content) == 0 {
		return nil, d.fail(an, "%s.artifacts must be a non-empty mapping from target triple to {url, sha256}", rpath)
	}
	r.Artifacts = map[string]Artifact{}
	for i := 0; i+1 < len(an.Content); i += 2 {
		k, v := an.Content[i], an.Content[i+1]
		if k.Kind != yaml.ScalarNode || !safeRE.MatchString(k.Value) {
			return nil, d.fail(k, "%s.artifacts: %q is not a target triple", rpath, clip(k.Value, 80))
		}
		if _, dup := r.Artifacts[k.Value]; dup {
			return nil, d.fail(k, "%s.artifacts has %s twice", rpath, k.Value)
		}
		apath := rpath + ".artifacts." + k.Value
		af, err := d.mapping(v, apath, "url", "sha256")
		if err != nil {
			return nil, err
		}
		var a Artifact
		if a.URL, _, err = d.str(af, v, "url", apath); err != nil {
			return nil, err
		}
		var sn *yaml.Node
		if a.SHA256, sn, err = d.str(af, v, "sha256", apath); err != nil {
			return nil, err
		}
		if !sha256RE.MatchString(a.SHA256) {
			return nil, d.fail(sn, "%s.sha256 must be 64 lower-case hex digits", apath)
		}
		r.Artifacts[k.Value] = a
	}
	if cn := rf["default_config"]; cn != nil {
		v, err := d.value(cn, rpath+".default_config", 0)
		if err != nil {
			return nil, err
		}
		r.DefaultConfig = v
	}
	return e, nil
}

// value turns a default_config node into plain values.
func (d *decoder) value(n *yaml.Node, path string, depth int) (any, error) {
	if depth > maxValueDepth {
		return nil, d.fail(n, "%s is nested more than %d levels deep", path, maxValueDepth)
	}
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return nil, d.fail(n, "%s uses a YAML anchor or alias, which a lock never has", path)
	}
	switch n.Kind {
	case yaml.MappingNode:
		out := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
				return nil, d.fail(k, "%s has a key that is not a string", path)
			}
			if _, dup := out[k.Value]; dup {
				return nil, d.fail(k, "%s has %q twice", path, clip(k.Value, 80))
			}
			v, err := d.value(n.Content[i+1], path+"."+k.Value, depth+1)
			if err != nil {
				return nil, err
			}
			out[k.Value] = v
		}
		return out, nil
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			v, err := d.value(c, fmt.Sprintf("%s[%d]", path, i), depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, d.fail(n, "%s: %v", path, err)
		}
		if f, ok := v.(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
			return nil, d.fail(n, "%s: %s is not a JSON number", path, n.Value)
		}
		switch v.(type) {
		case nil, string, bool, int, int64, uint64, float64:
			return v, nil
		}
		return nil, d.fail(n, "%s: %s values are not allowed", path, n.ShortTag())
	}
	return nil, d.fail(n, "%s has an unexpected YAML node", path)
}

func (d *decoder) graphs(n *yaml.Node, l *Lock) error {
	if n.Kind != yaml.MappingNode {
		return d.fail(n, "graphs must be a mapping from registry root to the containers it pulled in")
	}
	l.Graphs = map[string][]string{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return d.fail(k, "graphs has a key that is not a string")
		}
		if _, ok := l.Containers[k.Value]; !ok {
			return d.fail(k, "graphs.%s: every root must be a locked container, and %q is not", clip(k.Value, 80), clip(k.Value, 80))
		}
		if _, dup := l.Graphs[k.Value]; dup {
			return d.fail(k, "graphs has %s twice", k.Value)
		}
		if v.Kind != yaml.SequenceNode {
			return d.fail(v, "graphs.%s must be a list of container keys", k.Value)
		}
		nodes := []string{}
		for _, c := range v.Content {
			if c.Kind != yaml.ScalarNode || c.ShortTag() != "!!str" {
				return d.fail(c, "graphs.%s must be a list of container keys", k.Value)
			}
			if _, ok := l.Containers[c.Value]; !ok {
				return d.fail(c, "graphs.%s lists %q, which is not a locked container", k.Value, clip(c.Value, 80))
			}
			if contains(nodes, c.Value) {
				return d.fail(c, "graphs.%s lists %s twice", k.Value, c.Value)
			}
			nodes = append(nodes, c.Value)
		}
		l.Graphs[k.Value] = nodes
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

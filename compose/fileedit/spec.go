// Package fileedit edits a worker-compose.yaml the way compose::add,
// compose::remove and compose::update change it: the worker specs those
// functions take, and line-level edits of the file that keep everything
// else (comments, blank lines, quoting, key order) byte for byte, each
// result validated as a whole compose file before it is written.
package fileedit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/registry"
	"github.com/iii-sandbox/iii/compose/yamlbuild"
	"github.com/iii-sandbox/iii/internal/lazyre"
)

// AliasSandbox is the compose::add alias for the sandbox adapter.
const AliasSandbox = "iii-sandbox"

// containerFields are the fields a compose::add container object may
// carry, in the order Compose writes them.
var containerFields = []string{"worker", "version", "runtime", "start_after", "config_name", "config_override",
	"working_dir", "environment", "env_file", "startup_timeout", "scripts"}

// Addition is one worker compose::add puts in the file: its container key
// and the fields supplied (as YAML nodes).
type Addition struct {
	Key    string
	Kind   composefile.SourceKind
	Fields map[string]*yaml.Node
	// Src is the registry package of a package:// addition.
	Src composefile.Source
	// Latest asks for the package's latest version, written exact.
	Latest bool
	// Generated marks a dependency the registry graph of another addition
	// pulled in.
	Generated bool
}

// FlowList is a one-line [a, b] list, the way Compose writes start_after.
func FlowList(items []string) *yaml.Node {
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle}
	for _, it := range items {
		seq.Content = append(seq.Content, yamlbuild.Str(it))
	}
	return seq
}

// VersionNode writes a selector quoted, as the docs do: ^ and ~ read oddly
// bare, and 0.21 would be a number.
func VersionNode(s string) *yaml.Node {
	n := yamlbuild.Str(s)
	n.Style = yaml.SingleQuotedStyle
	return n
}

// ParseWorkerSpec reads a worker spec string: iii-sandbox (the adapter
// alias), path://dir, ./dir or /dir (a path worker), or a registry package:
// name, name@selector, host/name[@selector], or package://… . An unpinned
// package is marked for resolving to its exact latest version (the sandbox
// adapter instead gets the contract range Compose pins it to).
func ParseWorkerSpec(spec string) (*Addition, error) {
	s := strings.TrimSpace(spec)
	bad := func(why string) error {
		return compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("worker spec %q: %s", clip(spec, 120), why))
	}
	if s == "" {
		return nil, bad("it is empty; pass a directory (./workers/api), path://dir, a registry package (name, name@version, host/name) or iii-sandbox")
	}
	if s == AliasSandbox {
		return AdapterAddition(composefile.AdapterPackage, composefile.AdapterSelector), nil
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
		return &Addition{Key: key, Kind: composefile.SourcePath, Fields: map[string]*yaml.Node{"worker": yamlbuild.Str("path://" + dir)}}, nil
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
	a := &Addition{Key: base, Kind: composefile.SourcePackage, Fields: map[string]*yaml.Node{"worker": yamlbuild.Str("package://" + name)},
		Src: composefile.Source{Kind: composefile.SourcePackage, Registry: host, Name: base}}
	switch {
	case hasSel:
		a.Fields["version"] = VersionNode(sel)
	case base == composefile.AdapterPackage:
		// The adapter is pinned to the sandbox contract this engine
		// serves, not to whatever version is newest.
		a.Fields["version"] = VersionNode(composefile.AdapterSelector)
	default:
		a.Latest = true
	}
	return a, nil
}

// registryHostRE is a registry host with an optional port.
var registryHostRE = lazyre.New(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})(:[0-9]{1,5})?$`)

// AdapterAddition is the sandbox adapter package name pinned to sel.
func AdapterAddition(name, sel string) *Addition {
	return &Addition{Key: name, Kind: composefile.SourcePackage, Fields: map[string]*yaml.Node{
		"worker": yamlbuild.Str("package://" + name), "version": VersionNode(sel)},
		Src: composefile.Source{Kind: composefile.SourcePackage, Name: name}}
}

// ParseContainerObject reads a compose::add container object.
func ParseContainerObject(raw json.RawMessage) (*Addition, error) {
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
	a, err := ParseWorkerSpec(worker)
	if err != nil {
		return nil, err
	}
	if a.Kind == composefile.SourcePath {
		a.Fields["worker"] = yamlbuild.Str(ensureScheme(worker))
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
			if old := a.Fields["version"]; old != nil && strings.Contains(worker, "@") && old.Value != s {
				return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("version %q disagrees with the @%s in worker %q", s, old.Value, worker))
			}
			if a.Kind == composefile.SourcePackage {
				if err := registry.CheckSelector(s); err != nil {
					return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("version: %v", err))
				}
			}
			a.Fields[k] = VersionNode(s)
			a.Latest = false
			continue
		}
		n := &yaml.Node{}
		if err := n.Encode(val); err != nil {
			return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("field %s: %v", k, err))
		}
		a.Fields[k] = n
	}
	return a, nil
}

// ensureScheme writes a path worker with its path:// scheme, as the file
// spells it.
func ensureScheme(w string) string {
	if strings.HasPrefix(w, "path://") {
		return w
	}
	return "path://" + w
}

// ParseAdditions reads compose::add's worker= (string) and workers=
// (strings or container objects; it wins when both are given), as the
// request carried them.
func ParseAdditions(worker, workers json.RawMessage) ([]*Addition, error) {
	var raws []json.RawMessage
	if t := bytes.TrimSpace(workers); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if err := json.Unmarshal(t, &raws); err != nil || len(raws) == 0 {
			return nil, compose.New(compose.CodeInvalidWorkerSpec, "workers must be a non-empty list of worker specs or container objects")
		}
	} else if t := bytes.TrimSpace(worker); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
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
	var out []*Addition
	seen := map[string]bool{}
	for _, raw := range raws {
		var a *Addition
		var err error
		if len(raw) > 0 && raw[0] == '{' {
			a, err = ParseContainerObject(raw)
		} else {
			var s string
			if jerr := json.Unmarshal(raw, &s); jerr != nil {
				return nil, compose.New(compose.CodeInvalidWorkerSpec, "each worker must be a string spec or a container object")
			}
			a, err = ParseWorkerSpec(s)
		}
		if err != nil {
			return nil, err
		}
		if seen[a.Key] {
			return nil, compose.New(compose.CodeInvalidWorkerSpec, fmt.Sprintf("container %q is given twice", a.Key))
		}
		seen[a.Key] = true
		out = append(out, a)
	}
	return out, nil
}

// clip shortens s for an error message.
func clip(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
